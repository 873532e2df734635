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

import hashlib
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import reduce
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.errors import PySparkException
from pyspark.storagelevel import StorageLevel
from py4j.protocol import Py4JJavaError

from sira.pipelines.delta_io import (changed_data_files, has_change_data, read_data_files, read_table, row_count,
                                     table_exists, table_version)
from sira.core import tables
from sira.core.analysis import Analyzer, AnalyzerConfig, BatchAnalyzer, TermSet, index_text
from sira.core.defaults import DEFAULT_TAU
from sira.core.dfstats import phrase_candidates
from sira.core.hashing import TERM_ID_SCHEME, doc_hash, term_id
from sira.core.presets import IndexPreset


class TermIdCollision(RuntimeError):
    pass


class MissingAnalysis(RuntimeError):
    """The kept analysis of a document an incremental build needs is gone (compacted away): build in full."""


def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL string for an Arrow schema of sira.core.tables (the one place schemas are spelled)."""
    def sql(t: pa.DataType) -> str:
        if pa.types.is_list(t):
            return f"array<{sql(t.value_type)}>"
        if pa.types.is_struct(t):
            return "struct<" + ", ".join(f"{f.name}:{sql(f.type)}" for f in t) + ">"
        return {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.bool_(): "boolean",
                pa.float64(): "double", pa.timestamp("us", tz="UTC"): "timestamp"}[t]
    return ", ".join(f"{f.name} {sql(f.type)}" for f in schema)


def _without(schema: pa.Schema, *names: str) -> pa.Schema:
    return pa.schema([f for f in schema if f.name not in names])


def analyzer_key(analyzer_json: str) -> str:
    """Keys kept analyses: the analyzer's settings and the term-id scheme."""
    return hashlib.blake2b(f"{analyzer_json}|terms{TERM_ID_SCHEME}".encode(), digest_size=8).hexdigest()


# ---------------------------------------------------------------- Python workers (mapInArrow / applyInArrow) -----

_ANALYZERS: dict[str, BatchAnalyzer] = {}
_SENT: dict[str, TermSet] = {}


def _batch_analyzer(analyzer_json: str) -> BatchAnalyzer:
    """One per Python worker and analyzer: its word and stem caches carry over from task to task."""
    if analyzer_json not in _ANALYZERS:
        _ANALYZERS[analyzer_json] = BatchAnalyzer(AnalyzerConfig.model_validate_json(analyzer_json))
    return _ANALYZERS[analyzer_json]


def _sent_terms(build_id: str) -> TermSet:
    """Term ids this worker already sent to the dictionary during one build, so a frequent term is sent once per
    worker rather than once per batch. Scoped to the build: workers outlive builds, and another build (another
    warehouse) needs its own terms sent."""
    if build_id not in _SENT:
        _SENT.clear()
        _SENT[build_id] = TermSet()
    return _SENT[build_id]


# The analysis output: a document row (term_id and term null) or a dictionary row (only term_id and term set).
ANALYSIS_OUT = pa.schema([*_without(tables.DOC_ANALYSIS_SCHEMA, "analyzer_key"), *tables.TERM_DICTIONARY_SCHEMA])
CHANGES_ANALYSIS_OUT = pa.schema([*ANALYSIS_OUT, pa.field("sign", pa.int32())])  # a night's changes, analysed
PHRASES_OUT = pa.schema([*_without(tables.PHRASE_ANALYSIS_SCHEMA, "analyzer_key"), *tables.TERM_DICTIONARY_SCHEMA])


def _with_dictionary_rows(doc_rows: dict, schema: pa.Schema, term_ids: np.ndarray, terms: list[str]) -> pa.Table:
    n, m = len(next(iter(doc_rows.values()))), len(term_ids)
    docs = pa.table({**doc_rows, "term_id": pa.nulls(n, pa.int64()), "term": pa.nulls(n, pa.string())}, schema=schema)
    vocab = pa.table({**{f.name: pa.nulls(m, f.type) for f in schema if f.name not in ("term_id", "term")},
                      "term_id": pa.array(term_ids, pa.int64()), "term": pa.array(terms, pa.string())}, schema=schema)
    return pa.concat_tables([docs, vocab])


def warm_analyzers(analyzer_json: str):
    """mapInArrow: nothing out; the worker imports this module, builds its BatchAnalyzer and analyses a line with it
    (see `warm_python_workers`)."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # A first analysis loads numba's cached kernels and what the analyzer imports lazily: 0.6 s per worker with
        # compiled bytecode, 2 s without, which the night's analysis paid in its first tasks.
        _batch_analyzer(analyzer_json).analyze(pa.array(["warm the analyzer's kernels"]))
        import pandas  # noqa: F401 - Spark's grouped Arrow UDFs (the postings' applyInArrow) import it in the worker
        for _ in batches:
            pass
        return iter(())

    return fn


def warm_python_workers(spark: SparkSession, analyzer_json: str) -> threading.Thread:
    """Start, beside the build's first (JVM-only) steps, one task per core that leaves a Python worker behind with
    this module imported and its analyzer built. Spark reuses idle workers for a minute, and a night's analysis job
    (a few thousand documents) otherwise spent 7 of its seconds starting them. A failure here costs nothing: the
    analysis starts its workers as before."""

    def run():
        try:
            spark.sparkContext.setJobDescription("sira index: warm Python workers")  # this thread's jobs only
            n = spark.sparkContext.defaultParallelism
            spark.range(0, n, numPartitions=n).mapInArrow(warm_analyzers(analyzer_json), "id long").collect()
        except Exception:  # noqa: BLE001 - an optimisation only; the session may be stopping
            pass

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.start()
    return thread


def analyze_documents(analyzer_json: str, build_id: str, signed: bool = False):
    """mapInArrow: (doc_id, content_hash, title, text) -> analysis rows + the dictionary rows of new terms. `signed`:
    the rows are a night's changes (`Changes.rows`, with their sign, which their analysis rows keep); the terms of
    those that went are in the dictionary already, so only those that came send new ones."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        analyzer, sent = _batch_analyzer(analyzer_json), _sent_terms(build_id)
        schema = CHANGES_ANALYSIS_OUT if signed else ANALYSIS_OUT
        for batch in batches:
            if signed:
                came = pc.equal(batch.column("sign"), 1)
                parts = [(batch.filter(came), True), (batch.filter(pc.invert(came)), False)]
            else:
                parts = [(batch, True)]
            for part, spell in parts:
                if part.num_rows:
                    yield from _analysis_rows(analyzer, sent if spell else None, part, schema)

    return fn


def _analysis_rows(analyzer: BatchAnalyzer, sent: TermSet | None, batch: pa.RecordBatch,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The analysis rows of a batch's documents (and its `sign` when `schema` has one), then the dictionary rows of
    the terms `sent` lacks (none without `sent`)."""
    # index_text(title, text) in Arrow: no Python string per document (a leading space is no token).
    terms = analyzer.analyze(pc.binary_join_element_wise(batch.column("title"), batch.column("text"), " ",
                                                         null_handling="skip"))
    offsets = pa.array(terms.offsets.astype(np.int32))
    new_ids, new_terms = terms.new_terms(sent) if sent is not None else (np.empty(0, np.int64), [])
    rows = {
        "doc_id": batch.column("doc_id").cast(pa.string()),
        "content_hash": batch.column("content_hash").cast(pa.string()),
        "doc_hash": pa.array([doc_hash(d) for d in batch.column("doc_id").to_pylist()], pa.int64()),
        "doc_len": pa.array(terms.doc_lens, pa.int32()),
        "term_ids": pa.ListArray.from_arrays(offsets, pa.array(terms.term_ids, pa.int64())),
        "tfs": pa.ListArray.from_arrays(offsets, pa.array(terms.tfs, pa.int32())),
    }
    if "sign" in schema.names:
        rows["sign"] = batch.column("sign").cast(pa.int32())
    yield from _with_dictionary_rows(rows, schema, new_ids, new_terms).to_batches()


def analyze_phrases(analyzer_json: str):
    """mapInArrow: (doc_id, content_hash, phrases_key, phrases, title, text) -> each phrase's DF-independent
    decision and its term counts, + dictionary rows of the phrase terms (they may be injected)."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        analyzer = Analyzer(AnalyzerConfig.model_validate_json(analyzer_json))
        for batch in batches:
            cols = batch.to_pydict()
            candidates, spelled = [], {}
            for phrases, title, text in zip(cols["phrases"], cols["title"], cols["text"]):
                doc_tokens = analyzer.tokens(index_text(title, text))
                rows = []
                for c in phrase_candidates(phrases or [], doc_tokens, analyzer):
                    counts: dict[int, int] = {}
                    for t in c.terms:
                        tid = spelled.setdefault(t, term_id(t))
                        counts[tid] = counts.get(tid, 0) + 1
                    ids = sorted(counts)
                    rows.append({"phrase": c.phrase, "reason": c.reason, "term_ids": ids,
                                 "tfs": [counts[i] for i in ids]})
                candidates.append(rows)
            yield from _with_dictionary_rows({
                "doc_id": batch.column("doc_id").cast(pa.string()),
                "content_hash": batch.column("content_hash").cast(pa.string()),
                "phrases_key": batch.column("phrases_key").cast(pa.string()),
                "candidates": pa.array(candidates, pa.list_(tables.CANDIDATE_TYPE)),
            }, PHRASES_OUT, np.array(list(spelled.values()), np.int64), list(spelled)).to_batches()

    return fn


POSTINGS_OUT = _without(tables.SEGMENT_POSTINGS_SCHEMA, "segment")


def invert_block(block: pa.Table) -> pa.Table:
    """applyInArrow over one (shard, block) group of documents (doc_ord, term_ids, tfs[, inj_term_ids, inj_tfs])
    -> one postings row per term: its doc ordinals (ascending) and tfs. Injected terms add to the tf of a term
    the document already has."""
    ords = block.column("doc_ord").to_numpy()
    parts = [("term_ids", "tfs")]
    if "inj_term_ids" in block.column_names and block.column("inj_term_ids").null_count < block.num_rows:
        parts.append(("inj_term_ids", "inj_tfs"))
    terms, post_ords, tfs = [], [], []
    for ids_col, tfs_col in parts:
        ids = block.column(ids_col).combine_chunks()
        terms.append(pc.list_flatten(ids).to_numpy())
        post_ords.append(ords[pc.list_parent_indices(ids).to_numpy()])
        tfs.append(pc.list_flatten(block.column(tfs_col).combine_chunks()).to_numpy())
    terms, post_ords, tfs = np.concatenate(terms), np.concatenate(post_ords), np.concatenate(tfs)
    if len(parts) == 1:
        # Each document's ids are one ascending run: laid out in ordinal order, a stable sort by term (timsort
        # merges the runs) leaves every term's ordinals ascending.
        if np.all(ords[1:] > ords[:-1]):
            order = np.argsort(terms, kind="stable")
        else:
            by_ord = np.argsort(ords, kind="stable")
            lens = pc.list_value_length(block.column("term_ids").combine_chunks()).to_numpy(zero_copy_only=False)
            starts, lens = (np.cumsum(lens) - lens)[by_ord], lens[by_ord]
            take = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(lens.sum())
            order = take[np.argsort(terms[take], kind="stable")]
    else:
        order = np.lexsort((post_ords, terms))
    terms, post_ords, tfs = terms[order], post_ords[order], tfs[order]
    if len(parts) > 1:
        same = (terms[1:] == terms[:-1]) & (post_ords[1:] == post_ords[:-1])
        if same.any():
            keep = np.flatnonzero(np.concatenate([[True], ~same]))
            tfs, terms, post_ords = np.add.reduceat(tfs, keep), terms[keep], post_ords[keep]
    firsts = np.flatnonzero(np.concatenate([[True], terms[1:] != terms[:-1]])) if len(terms) else np.empty(0, int)
    offsets = pa.array(np.concatenate([firsts, [len(terms)]]).astype(np.int32))
    n = len(firsts)
    shard, number = block.column("shard")[0].as_py(), block.column("block")[0].as_py()
    return pa.table({
        "shard": pa.array(np.full(n, shard, np.int32)), "term_id": pa.array(terms[firsts], pa.int64()),
        "block": pa.array(np.full(n, number, np.int32)),
        "doc_ords": pa.ListArray.from_arrays(offsets, pa.array(post_ords.astype(np.int32))),
        "tfs": pa.ListArray.from_arrays(offsets, pa.array(tfs.astype(np.int32))),
    }, schema=POSTINGS_OUT)


POSTING_COUNTS_OUT = pa.schema([("term_id", pa.int64()), ("df", pa.int64()), ("cf", pa.int64())])


def posting_counts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: postings rows (term_id, tfs) -> (term_id, df, cf) of each row, in numpy (Spark's higher-order
    `aggregate` over the tfs costs ten times as much)."""
    for batch in batches:
        tfs = batch.column("tfs")
        lengths = pc.list_value_length(tfs).to_numpy(zero_copy_only=False).astype(np.int64)
        sums = np.bincount(pc.list_parent_indices(tfs).to_numpy(), weights=pc.list_flatten(tfs).to_numpy(),
                           minlength=len(lengths)).astype(np.int64)  # float64 sums of ints: exact below 2^53
        yield pa.record_batch([batch.column("term_id"), pa.array(lengths), pa.array(sums)], schema=POSTING_COUNTS_OUT)


# ---------------------------------------------------------------- the build ----------------------------------------


@dataclass(frozen=True)
class EnrichmentChoice:
    """Which enrichment rows an index injects: by default each document's newest successful one for its
    current content; `model` / `prompt_version` narrow that down."""

    tau: float = DEFAULT_TAU
    model: str | None = None
    prompt_version: str | None = None


@dataclass(frozen=True)
class SegmentPolicy:
    """How many segments and dead documents a version may hold before a build merges segments into its new one."""

    max_segments: int = 16
    # Tombstoned documents / documents in the version's segments; past it (with the small segments merged), every
    # segment merges.
    max_dead_fraction: float = 0.25
    # Past max_segments, the base's segments holding fewer live documents than this share of the version's merge
    # into the new segment (a night's segments, not the big one a full build wrote).
    merge_below_fraction: float = 0.1
    # A version's term_stats: some version's whole statistics and at most this many - 1 builds' changes (readers sum
    # them, sira.core.tables.TERM_STATS_SCHEMA); past that a build writes its statistics whole.
    max_term_stats_versions: int = 8


@dataclass
class Build:
    spark: SparkSession
    warehouse: str
    preset: IndexPreset
    num_shards: int
    enrichment: EnrichmentChoice | None
    version: int
    docs_version: int
    log: Callable[[str], None]
    analyzer_json: str = ""
    analyzer_key: str = ""
    build_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    persisted: list = field(default_factory=list)
    # An incremental build's analyses of the documents whose content came or went since the base (set by
    # `original_df`; sign 1 came, -1 went), and in an enriched one also of those that enter again for their
    # injections alone (sign 0, `_with_unchanged_movers`): the entering and leaving documents are read from here,
    # not from the whole table.
    changed: DataFrame | None = None
    changed_rows: int = 0
    # With the night's changes: the analyses of the documents whose content came or went (CHANGES keys, sign, the
    # doc_analysis columns), made by `_analyse_changes` from the texts the change feed holds.
    moved: DataFrame | None = None
    live: DataFrame | None = None  # the base's segment_docs rows of its live documents (`_live_docs`), once read
    seconds: dict = field(default_factory=dict)  # per step, reported with the build

    def __post_init__(self):
        self.analyzer_json = self.preset.analyzer.model_dump_json()
        self.analyzer_key = analyzer_key(self.analyzer_json)

    def uri(self, name: str) -> str:
        return tables.table_uri(self.warehouse, name)

    def read(self, name: str, version: int | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.uri(name))

    def keep(self, df: DataFrame, level: StorageLevel = StorageLevel.DISK_ONLY) -> DataFrame:
        """Persist (on disk by default: these frames are corpus-sized) until the build ends."""
        self.persisted.append(df.persist(level))
        return self.persisted[-1]

    def cut(self, df: DataFrame) -> DataFrame:
        """`df` computed once and stored on disk without its lineage, for a small frame that later plans join several
        times: a kept frame's plan is printed in full inside every plan that reads it, and adaptive execution prints
        the plan at each of its updates. Through the moved terms, an enriched night's term_stats plan had grown to
        180 MB of text (12 documents) and ran a 3 GB heap out of memory. And for a frame that reads a table the
        build writes afterwards: each write re-plans every kept frame that reads the table and drops its data, which
        the next use computes again (2-3 s of a night at 1M documents). A local checkpoint: an executor lost before
        the build ends fails the build, which a rerun redoes."""
        return df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)

    @contextmanager
    def step(self, name: str):
        started = time.perf_counter()
        self.spark.sparkContext.setJobDescription(f"sira index v{self.version}: {name}")  # names its jobs in Spark's UI
        try:
            yield
        finally:
            self.spark.sparkContext.setJobDescription(None)
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def release(self) -> None:
        # Newest first: a frame unpersisted while a later one built on it is still cached makes Spark re-plan that
        # one (for a Delta scan, a file listing each time): 20 s at 1M documents, in the old order.
        for df in reversed(self.persisted):
            df.unpersist()
        self.persisted.clear()


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
        injections, per_doc, enrichment_info, moves = None, None, _no_enrichment(), None
        if enrichment is not None:
            with b.step("injections"):
                if base is not None and changes is not None:
                    moves = incremental_injections(b, docs, base, changes, orig_delta, num_docs)
                if moves is None:
                    injections, per_doc, enrichment_info = inject_enrichment(b, docs, orig_df, num_docs)
        with b.step("segment plan"):
            plan = plan_segments(b, None if moves else desired_documents(current, per_doc), base, policy, moves)
        if moves is not None:
            injections, enrichment_info = moves.injections, {**moves.info, **_moved_counts(base, plan)}
            if plan.carried is not None:  # the merged documents' decisions go with them
                names = tables.SEGMENT_INJECTIONS_SCHEMA.names[1:]
                injections = injections.select(*names).unionByName(carried_decisions(b, plan).select(*names))
        rows, n_rows = plan.written()
        if injections is not None and plan.base is not None and moves is None:
            # Decided for every document: the new segment keeps those of the documents it holds.
            injections = injections.join(_small(rows.select("doc_id"), n_rows), "doc_id", "left_semi")
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
    from sira.pipelines.spark_session import get_spark
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
    import gc

    gc.collect()  # Python's references to the build's Java plans go first (py4j detaches them)
    spark.sparkContext._jvm.System.gc()


def _no_enrichment() -> dict:
    return {"enriched": False, "enrichment_table_version": None, "tau": None, "phrases_proposed": 0,
            "phrases_kept": 0, "enrichment_model": None, "enrichment_prompt_version": None}


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


# Rows per file of the appends whose size is known before they are written: a night's analyses and statistics (a few
# thousand documents, a few hundred thousand terms) go to one file each instead of one per shuffle partition, which
# cost a task each and left a dozen small files per table per night for every later scan to open.
ANALYSIS_ROWS_PER_FILE = 100_000  # term vectors: about 1-2 KB a document
TERM_ROWS_PER_FILE = 2_000_000  # dictionary and term_stats rows: a few dozen bytes each


def _in_files(df: DataFrame, rows: int | None, rows_per_file: int) -> DataFrame:
    """`df` in about rows / rows_per_file partitions when `rows` is known (never more than it has)."""
    return df if rows is None else df.coalesce(max(1, -(-rows // rows_per_file)))


def _replace(df: DataFrame, uri: str, column: str, value: int, partition_by: list[str], evolve: bool = False) -> int:
    """Write `df` as the rows of `column = value` (a version's or a segment's), replacing any a killed build left;
    `evolve`: a table written before a column was added gains it."""
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", f"{column} = {value}")
    if evolve:
        writer = writer.option("mergeSchema", "true")
    writer.partitionBy(*partition_by).save(uri)
    return table_version(uri)


# ---- 0. what changed ---------------------------------------------------------------------------------------------


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


# ---- 1. analysis -------------------------------------------------------------------------------------------------


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
        done = _analyses(b).select(*key)
        kept = _kept_analyses(b, done)
        # Which documents lack an analysis, on the keys alone; the texts are read for those only.
        missing = b.keep(docs.select(*key).join(done, key, "left_anti"))
        new = missing.count()
        if new < num_docs:
            todo = todo.join(_small(missing, new), key)
        stale = kept - (num_docs - new)  # analyses of documents that changed or left since
    b.log(f"analysis: {new} new or changed documents to analyse, {num_docs - new} kept from earlier builds")
    if new:
        out = b.keep(todo.mapInArrow(analyze_documents(b.analyzer_json, b.build_id), spark_ddl(ANALYSIS_OUT)))
        analyses = out.where(F.col("doc_id").isNotNull()).drop("term_id", "term")
        _keep_analyses(b, out.where(F.col("doc_id").isNull()).select("term_id", "term"), analyses, new)
        b.log(f"analysis: {new} documents analysed")
    return num_docs, new, stale


def _analyses(b: Build) -> DataFrame:
    """The kept analyses of this build's analyzer (doc_analysis without its analyzer_key)."""
    return b.read(tables.DOC_ANALYSIS).where(F.col("analyzer_key") == b.analyzer_key).drop("analyzer_key")


def _kept_analyses(b: Build, done: DataFrame) -> int:
    """How many analyses `done` (this analyzer's, as `_analyses`) holds: from the Delta log when it knows."""
    kept = row_count(b.uri(tables.DOC_ANALYSIS), partition=("analyzer_key", b.analyzer_key))
    return done.count() if kept is None else kept


def _keep_analyses(b: Build, spelled: DataFrame, analyses: DataFrame, rows: int) -> None:
    """Append the new terms `spelled` (term_id, term) to the dictionary, then `analyses` (`rows` of them; the
    doc_analysis columns but analyzer_key, and maybe others) to the kept ones."""
    # The dictionary first: a kept analysis implies its terms are spelled (a kill in between re-analyses).
    merge_dictionary(b, spelled)
    (_in_files(analyses.select(F.lit(b.analyzer_key).alias("analyzer_key"), *_without(
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
        done = _analyses(b).select(*key)
        if changes.came:
            # Cut from the table's lineage: the append below would re-plan a kept frame that reads it.
            have = b.cut(_small(changes.rows.where(F.col("sign") == 1).select(*key), changes.came).join(done, key))
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
                       came.join(_small(have, n_have), key, "left_anti") if n_have else came, new)
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
    spellings = b.keep(spelled.groupBy("term_id").agg(F.min("term").alias("term"), F.max("term").alias("other")))
    n = spellings.count()
    # One join with the dictionary, stored: the check and the append both read it, and `limit` runs a job per few
    # partitions, each of which redid the join.
    if table_exists(uri):
        if n <= BROADCAST_ROWS:
            # A night's terms go to every task and the dictionary streams past them: the corpus-sized table is read,
            # not shuffled (an outer join would shuffle it, whichever side is small).
            known = b.read(tables.TERM_DICTIONARY).withColumnRenamed("term", "known").join(
                F.broadcast(spellings.select("term_id")), "term_id")
            spellings = spellings.join(_small(known, n), "term_id", "left")
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
    _in_files(new, n, TERM_ROWS_PER_FILE).write.format("delta").mode("append").save(uri)


def _enrichment_phrases(b: Build, docs: DataFrame, version: int | None = None) -> tuple[DataFrame, int]:
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
    return b.keep(phrases), version


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
            found = b.cut(done.join(_small(phrases.select(*keys), rows), keys, "left_semi"))
            n_found = found.count()
            todo = phrases.join(_small(found.select(*keys), n_found), keys, "left_anti") if n_found else phrases
    columns = ["doc_id", "content_hash", "phrases_key", "phrases", "title", "text"]
    if texts is not None:
        todo = b.cut(todo)
        have = todo.join(texts, doc)
        rest = b.cut(todo.join(texts.select(*doc), doc, "left_anti"))
        n_rest = rest.count()
        todo = have.unionByName(_small(rest, n_rest).join(docs.select(*doc, "title", "text"), doc)) if n_rest else have
    else:
        todo = todo.join(docs.select(*doc, "title", "text"), doc)
    out = b.keep(todo.select(*columns).mapInArrow(analyze_phrases(b.analyzer_json), spark_ddl(PHRASES_OUT)))
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


# Up to this many rows, the small side of a join is sent to every task (a broadcast join) rather than the big side
# shuffled: a night's changed documents against the whole kept analysis, its new terms against the dictionary.
BROADCAST_ROWS = 2_000_000


def _small(df: DataFrame, rows: int | None) -> DataFrame:
    return F.broadcast(df) if rows is not None and rows <= BROADCAST_ROWS else df


def _analysis_of(b: Build, keys: DataFrame, rows: int | None = None) -> DataFrame:
    """The kept analysis of the documents in `keys` (doc_id, content_hash, ...), joined to them; `rows`: how many
    keys there are, when known (few are broadcast). In a plain incremental build they are read from `b.changed`."""
    if b.changed is not None:  # the corpus-sized table is not scanned again for each
        done = b.changed.drop("sign")
    else:
        done = _analyses(b)
    return _small(keys, rows).join(done, ["doc_id", "content_hash"])


def _term_counts(df: DataFrame, ids: str = "term_ids", tfs: str = "tfs", keep: tuple[str, ...] = ("doc_id",)) -> DataFrame:
    """(*keep, term_id, tf): one row per term of each term vector in `df`."""
    return df.select(*keep, F.explode(F.arrays_zip(F.col(ids).alias("i"), F.col(tfs).alias("t"))).alias("p")) \
        .select(*keep, F.col("p.i").alias("term_id"), F.col("p.t").alias("tf"))


def _require_analysis(b: Build, keys: DataFrame, what: str, joined: DataFrame | None = None) -> DataFrame:
    """The kept analysis of `keys` (or `joined`, when already read), checked to cover each of them once (it is never
    silently partial)."""
    expected = keys.count()
    joined = b.keep(_analysis_of(b, keys, expected)) if joined is None else joined
    got = joined.count()
    if got != expected:
        raise MissingAnalysis(f"{tables.DOC_ANALYSIS} holds {got} analyses for the {expected} {what} (analyzer "
                              f"{b.analyzer_key})")
    return joined


# ---- 2-4. original DF and the corpus-side DF rule ------------------------------------------------------------------


def find_base(b: Build) -> dict | None:
    """The newest published version this build can extend: same layout, analyzer, shards and enrichment choice."""
    from sira.pipelines.shard_loader import published_versions

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


def _live_docs(b: Build, base: dict) -> DataFrame:
    """segment_docs rows of the base version's documents (its segments minus its tombstones), kept for the build."""
    if b.live is None:
        b.live = b.keep(_read_live_docs(b, base))
    return b.live


def _read_live_docs(b: Build, base: dict) -> DataFrame:
    # Published segments and a published version's rows never change, so the tables' latest versions serve (a
    # pinned old table version could outlive the Delta log's retention).
    docs = b.read(tables.SEGMENT_DOCS).where(F.col("segment").isin(list(base["segments"])))
    # Segments written before the decision columns: a plain one's values, which an enriched base never lacks.
    docs = docs.select(*[c for c in docs.columns if c not in INJECTED_COLUMNS], *[
        (F.coalesce(c, _not_injected(c)) if c in docs.columns else _not_injected(c)).alias(c) for c in INJECTED_COLUMNS])
    if base.get("num_tombstones"):
        dead = b.read(tables.TOMBSTONES).where(F.col("index_version") == base["index_version"])
        docs = docs.join(dead.select("segment", "shard", "doc_ord"), ["segment", "shard", "doc_ord"], "left_anti")
    return docs


def original_df(b: Build, current: DataFrame, base: dict | None,
                changes: Changes | None = None) -> tuple[DataFrame | None, DataFrame | None]:
    """(term_id, df) in the original corpus, needed by enriched builds (the DF rule) and by incremental ones
    (term_stats.df moves with the documents whose content changed); None when the postings give it (a plain full
    build). Incrementally it is the base's plus the delta of documents whose content came or went."""
    if base is None:
        if b.enrichment is None:
            return None, None
        return b.keep(_term_counts(_analysis_of(b, current)).groupBy("term_id").agg(
            F.count("*").cast("long").alias("df"))), None
    key = ["doc_id", "content_hash"]
    if changes is not None:
        came_went = changes.rows.select(*key, "sign")
    else:
        # One outer join of the current documents with the base's finds both what came (sign 1) and what went (-1).
        sides = current.select(*key, F.lit(True).alias("now")).join(
            _live_docs(b, base).select(*key, F.lit(True).alias("before")), key, "full_outer")
        came_went = b.keep(sides.where(F.col("now").isNull() | F.col("before").isNull()).select(
            *key, F.when(F.col("now"), F.lit(1)).otherwise(F.lit(-1)).alias("sign")))
    changed = _require_analysis(b, came_went, "documents whose content came or went", b.moved)
    # An enriched build adds the documents whose injections alone change (`_with_unchanged_movers`).
    b.changed, b.changed_rows = changed, changed.count()
    # d_cf too: in a plain build the documents whose content moved are those entering and leaving, so this is the
    # whole change of term_stats (`term_statistics` takes it as is).
    delta = b.keep(_term_counts(changed, keep=("sign",)).groupBy("term_id")
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
    phrases, enrichment_version = _enrichment_phrases(b, docs)
    analyse_phrases(b, docs, phrases)
    injections, per_doc = decide_injections(b, phrases, orig_df, num_docs)
    info = {**_no_enrichment(), "enrichment_table_version": enrichment_version,
            **_injection_counts(injections, b.enrichment)}
    b.log(f"enrichment v{enrichment_version}: kept {info['phrases_kept']} of {info['phrases_proposed']} proposed phrases")
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
    info: dict  # corpus_stats' enrichment columns, but the phrase counts (`_moved_counts`)


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
                   .join(_small(flipped, n_flipped), "term_id", "left_semi").select("doc_id"))
        affected = affected.unionByName(holders)
    affected = b.cut(affected.distinct())
    n_affected = affected.count()
    # Their rows in the base (the content they had, their decisions), and the content they have now.
    live = b.cut(_read_live_docs(b, base).join(_small(affected, n_affected), "doc_id", "left_semi"))
    came = changes.rows.where("sign = 1").select(*key, "title", "text")
    moved_ids = changes.rows.select("doc_id").distinct()
    current = b.cut(came.select(*key).unionByName(
        live.select(*key).join(_small(moved_ids, changes.came + changes.went), "doc_id", "left_anti")))
    n_current = current.count()
    found = time.perf_counter()
    phrases, enrichment_version = _enrichment_phrases(b, _small(current, n_current), version)
    n_phrases = phrases.count()
    analysed = analyse_phrases(b, docs, phrases, n_phrases, texts=came)
    checked = time.perf_counter()
    decided, per_doc = decide_injections(b, None, lambda terms, n: _original_df_of(b, base, orig_delta, terms, n),
                                         num_docs, analysed)
    desired = desired_documents(current, per_doc)
    changed = ["doc_id", "content_hash", "inject_key", "decisions_key"]
    entering = b.keep(desired.join(_small(live.select(*changed), n_affected), changed, "left_anti"))
    n_entering = entering.count()
    leaving_ids = b.cut(entering.select("doc_id").unionByName(
        changes.rows.where("sign = -1").select("doc_id")).distinct())
    b.log(f"injections: {n_affected} documents decided again ({len(touched)} with enrichment rows that came or "
          f"went, {n_flipped} terms crossed the DF limit), {n_entering} of them enter the new segment; seconds: "
          f"finding them {found - started:.1f}, their phrases {checked - found:.1f}, deciding "
          f"{time.perf_counter() - checked:.1f}")
    info = {**_no_enrichment(), "enriched": True, "tau": b.enrichment.tau, "enrichment_table_version":
            enrichment_version, "enrichment_model": b.enrichment.model,
            "enrichment_prompt_version": b.enrichment.prompt_version}
    return InjectionMoves(entering, n_entering, leaving_ids, leaving_ids.count(),
                          decided.join(_small(entering.select("doc_id"), n_entering), "doc_id", "left_semi"), info)


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
    held = b.cut(before.join(_small(delta, n_delta), "term_id", "left")
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
    delta = orig_delta.select("term_id", "d_df").join(_small(terms, rows), "term_id", "left_semi")
    before = b.cut(base_df_of(b, base, terms, rows))
    return (_small(terms, rows).join(_small(before, rows), "term_id", "left").join(delta, "term_id", "left")
            .select("term_id", (F.coalesce("df", zero) + F.coalesce("d_df", zero)).alias("df")).where("df > 0"))


def base_df_of(b: Build, base: dict, terms: DataFrame, rows: int) -> DataFrame:
    """(term_id, df) in the base's original corpus of those of `terms` (term_id; `rows` of them) it holds: its
    term_stats rows of those terms alone summed (the few terms go to every task and the rows stream past them)."""
    return (_term_stats_rows(b, base).join(_small(terms, rows), "term_id", "left_semi")
            .groupBy("term_id").agg(F.sum("df").cast("long").alias("df")))


def carried_decisions(b: Build, plan: SegmentPlan) -> DataFrame:
    """The segment_injections rows (less `segment`) of the documents a merge carries, from the segments they were
    live in."""
    rows = b.read(tables.SEGMENT_INJECTIONS).where(F.col("segment").isin(plan.merged))
    return rows.join(_small(plan.carried.select("segment", "doc_id"), plan.carried_rows), ["segment", "doc_id"],
                     "left_semi").drop("segment")


def _moved_counts(base: dict, plan: SegmentPlan) -> dict:
    """The version's phrase counts: the base's, less those of the documents that left, plus those that entered."""
    def sums(df: DataFrame) -> tuple[int, int]:
        row = df.agg(F.sum("phrases_proposed"), F.sum("phrases_kept")).first()
        return int(row[0] or 0), int(row[1] or 0)

    (p_in, k_in), (p_out, k_out) = sums(plan.entering), sums(plan.leaving)
    return {"phrases_proposed": int(base["phrases_proposed"]) + p_in - p_out,
            "phrases_kept": int(base["phrases_kept"]) + k_in - k_out}


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
    decided = b.keep(
        cands.join(min_df, ["doc_id", "position"], "left")
        .withColumn("kept", F.col("c.reason").isNull() & (F.col("min_df") <= F.lit(limit)))
        .select("doc_id", F.col("position").cast("int"), F.col("c.phrase").alias("phrase"), "kept",
                F.coalesce("c.reason", F.when(F.col("kept"), "kept").otherwise("too common")).alias("reason"),
                F.when(F.col("c.reason").isNull(), F.col("min_df")).alias("min_df"),
                F.col("c.term_ids").alias("term_ids"), F.col("c.tfs").alias("tfs")))
    injected = (_term_counts(decided.where("kept")).groupBy("doc_id", "term_id").agg(F.sum("tf").alias("tf"))
                .groupBy("doc_id").agg(F.sort_array(F.collect_list(F.struct("term_id", "tf"))).alias("p"))
                .select("doc_id", F.col("p.term_id").alias("inj_term_ids"), F.col("p.tf").cast("array<int>").alias("inj_tfs"))
                .withColumn("inject_key", F.sha2(F.to_json(F.struct("inj_term_ids", "inj_tfs")), 256).substr(1, 32)))
    per_doc = decided.groupBy("doc_id").agg(
        F.sha2(F.to_json(F.sort_array(F.collect_list(F.struct("position", "phrase", "kept", "reason")))), 256)
        .substr(1, 32).alias("decisions_key"),
        F.count("*").cast("int").alias("phrases_proposed"),
        F.sum(F.col("kept").cast("int")).cast("int").alias("phrases_kept"))
    return decided.drop("term_ids", "tfs"), b.keep(per_doc.join(injected, "doc_id", "left"))


def _injection_counts(decided: DataFrame, e: EnrichmentChoice) -> dict:
    counts = decided.agg(F.count("*").alias("proposed"), F.sum(F.col("kept").cast("int")).alias("kept")).first()
    return {"enriched": True, "tau": e.tau, "phrases_proposed": int(counts["proposed"]),
            "phrases_kept": int(counts["kept"] or 0), "enrichment_model": e.model,
            "enrichment_prompt_version": e.prompt_version}


# What a segment_docs row holds of a document's enrichment beyond its analysis: (type, value without any).
INJECTED_COLUMNS = {"inject_key": ("string", ""), "inj_term_ids": ("array<bigint>", None),
                    "inj_tfs": ("array<int>", None), "decisions_key": ("string", ""), "phrases_proposed": ("int", 0),
                    "phrases_kept": ("int", 0)}


def _not_injected(column: str) -> Column:
    kind, value = INJECTED_COLUMNS[column]
    return F.lit(value).cast(kind)


def desired_documents(current: DataFrame, per_doc: DataFrame | None) -> DataFrame:
    """(doc_id, content_hash, *INJECTED_COLUMNS): every document of `current` as the new version should hold it (no
    injected terms when `per_doc`, the enriched ones from `decide_injections`, is None)."""
    if per_doc is None:
        return current.select("doc_id", "content_hash", *[_not_injected(c).alias(c) for c in INJECTED_COLUMNS])
    return current.join(per_doc, "doc_id", "left").select("doc_id", "content_hash", *[
        F.coalesce(F.col(c).cast(kind), _not_injected(c)).alias(c) for c, (kind, _) in INJECTED_COLUMNS.items()])


# ---- 5-7. segments, postings, statistics -------------------------------------------------------------------------


@dataclass
class SegmentPlan:
    entering: DataFrame  # desired rows of the documents the night brings into the new segment
    entering_rows: int | None  # how many, when counted
    leaving: DataFrame | None  # base segment_docs rows of the documents tombstoned now
    base: dict | None
    segments: list[int]
    tombstones: DataFrame | None  # (segment, shard, doc_ord) of every tombstone of the new version
    num_tombstones: int
    base_version: int | None
    # The live rows (desired columns and their old `segment`) of the merged segments' documents that stay: they
    # enter the new segment as they are.
    carried: DataFrame | None = None
    carried_rows: int = 0
    merged: list[int] = field(default_factory=list)

    def written(self) -> tuple[DataFrame, int | None]:
        """The rows the new segment holds (a `carried` column tells the merged ones) and how many."""
        if self.carried is None:
            return self.entering, self.entering_rows
        cols = ["doc_id", "content_hash", *INJECTED_COLUMNS]
        rows = self.entering.select(*cols, F.lit(False).alias("carried")).unionByName(
            self.carried.select(*cols, F.lit(True).alias("carried")))
        return rows, self.entering_rows + self.carried_rows


def plan_segments(b: Build, desired: DataFrame | None, base: dict | None, policy: SegmentPolicy,
                  moves: InjectionMoves | None = None) -> SegmentPlan:
    """What enters and leaves on top of `base`: what came and went (plain), `moves` (an enriched night's), or every
    `desired` document that differs from the base's; past the policy, segments merged into the new one
    (`_segments_to_merge`). Without a base, a full build's plan: every `desired` document."""
    key = ["doc_id", "content_hash", "inject_key", "decisions_key"]
    if base is not None:
        if moves is not None:
            live = b.live if b.live is not None else _read_live_docs(b, base)
            leaving = b.cut(live.join(_small(moves.leaving_ids, moves.leaving_rows), "doc_id", "left_semi"))
            entering = moves.entering
        elif b.changed is not None and b.enrichment is None:
            # Plain: no document's injections change, so what enters is what came and what leaves is what went.
            moved = b.changed.select("doc_id", "content_hash", "sign")
            entering = b.keep(desired_documents(moved.where("sign = 1").drop("sign"), None))
            went = moved.where("sign = -1").drop("sign")
            # The base's documents are read once here: not kept (a corpus-sized write to disk for one read).
            live = b.live if b.live is not None else _read_live_docs(b, base)
            # Cut, not kept: writing segment_docs (below) would drop a kept frame that reads it, and the term
            # statistics and tombstones would read the table again (2 s at 1M documents).
            leaving = b.cut(live.join(_small(went, b.changed_rows), ["doc_id", "content_hash"], "left_semi"))
        else:
            live = _live_docs(b, base)
            leaving = b.keep(live.join(desired.select(*key), key, "left_anti"))
            entering = b.keep(desired.join(live.select(*key), key, "left_anti"))
        n_leaving, n_entering = leaving.count(), entering.count()
        held, dead = _segment_counts(b, base, leaving)
        merged = _segments_to_merge(held, dead, n_entering, policy)
        kept = [s for s in base["segments"] if s not in merged]
        n_dead = sum(dead.get(s, 0) for s in kept)
        n_carried = sum(held[s] - dead.get(s, 0) for s in merged)
        segments = kept + ([b.version] if n_entering or n_carried else [])
        b.log(f"incremental on v{base['index_version']}: {n_entering} documents enter segment {b.version}, "
              f"{n_leaving} leave; {n_dead} tombstones in {len(segments)} segments")
        tombstones = leaving.select("segment", "shard", "doc_ord")
        if base.get("num_tombstones"):
            old = b.read(tables.TOMBSTONES).where(
                F.col("index_version") == base["index_version"]).select("segment", "shard", "doc_ord")
            tombstones = old.unionByName(tombstones)
        carried = None
        if merged:  # the merged segments leave the version with their tombstones
            carried = _carried(b, base, merged, live, leaving, n_carried)
            tombstones = tombstones.where(~F.col("segment").isin(merged))
        plan = SegmentPlan(entering, n_entering, leaving, base, segments, tombstones, n_dead, base["index_version"],
                           carried, n_carried, merged)
        if b.enrichment is not None or merged:
            rows, n_rows = plan.written()
            _with_unchanged_movers(b, rows, n_rows)
        return plan
    b.log("full build: no earlier version of this kind, or --full")
    return SegmentPlan(desired, None, None, None, [b.version], None, 0, None)


def _segment_counts(b: Build, base: dict, leaving: DataFrame) -> tuple[dict[int, int], dict[int, int]]:
    """segment -> documents it holds, and segment -> those of them dead in the new version (the base's tombstones
    and those leaving now), for the base's segments."""
    held = {r[0]: r[1] for r in b.read(tables.SEGMENT_DOCS).where(F.col("segment").isin(list(base["segments"])))
            .groupBy("segment").count().collect()}
    dead: dict[int, int] = {}
    sources = [leaving]
    if base.get("num_tombstones"):
        sources.append(b.read(tables.TOMBSTONES).where(F.col("index_version") == base["index_version"]))
    for rows in sources:
        for segment, n in rows.groupBy("segment").count().collect():
            dead[segment] = dead.get(segment, 0) + n
    missing = [s for s in base["segments"] if s not in held]
    if missing:
        raise RuntimeError(f"{tables.SEGMENT_DOCS} holds no rows of segments {missing} of index version "
                           f"{base['index_version']}")
    return held, dead


def _segments_to_merge(held: dict[int, int], dead: dict[int, int], n_entering: int,
                       policy: SegmentPolicy) -> list[int]:
    """The base's segments whose live documents enter the new segment: none while the version stays within the
    policy; past it, the small ones (fewer live documents than policy.merge_below_fraction of the version's), and
    when that is not enough (too many dead documents in the big ones), every segment: a compaction that carries
    each live document's analysis, injections and decisions (none is decided again)."""
    live = {s: n - dead.get(s, 0) for s, n in held.items()}

    def within(merged: list[int]) -> bool:
        kept = [s for s in held if s not in merged]
        n_segments = len(kept) + (1 if n_entering or merged else 0)
        in_segments = sum(held[s] for s in kept) + n_entering + sum(live[s] for s in merged)
        return (n_segments <= policy.max_segments
                and sum(dead.get(s, 0) for s in kept) <= policy.max_dead_fraction * in_segments)

    if within([]):
        return []
    limit = policy.merge_below_fraction * (sum(live.values()) + n_entering)
    small = sorted(s for s, n in live.items() if n < limit)
    return small if small and within(small) else sorted(held)


def _carried(b: Build, base: dict, merged: list[int], live: DataFrame, leaving: DataFrame, rows: int) -> DataFrame:
    """The live rows of the merged segments' documents that stay (`rows` of them, as the counts said)."""
    place = ["segment", "shard", "doc_ord"]
    # Cut, not kept: writing segment_docs would drop a kept frame that reads it.
    carried = b.cut(live.where(F.col("segment").isin(merged)).join(leaving.select(*place), place, "left_anti"))
    got = carried.count()
    if got != rows:
        raise RuntimeError(f"segments {merged} hold {got} live documents, not the {rows} their "
                           f"{tables.SEGMENT_DOCS} rows and tombstones count")
    b.log(f"merge: segments {merged} merge into segment {b.version} with their {rows} live documents"
          + (" (all of them: a compaction that decides nothing again)" if merged == sorted(base["segments"]) else ""))
    return carried


def _with_unchanged_movers(b: Build, entering: DataFrame, rows: int) -> None:
    """Add to `b.changed` (sign 0) the kept analyses of the documents that enter the new segment with the content
    they had: their injections changed, or their segment merges into the new one. Read only when there are such
    documents."""
    key = ["doc_id", "content_hash"]
    came = b.changed.where("sign = 1").select(*key)
    unchanged = b.cut(_small(entering.select(*key), rows).join(came, key, "left_anti"))
    n = unchanged.count()
    if n:
        kept = _require_analysis(b, unchanged, "documents whose injections changed",
                                 b.cut(_small(unchanged, n).join(_analyses(b), key)))
        b.changed = b.changed.unionByName(kept.withColumn("sign", F.lit(0)))
        b.changed_rows += n
    b.log(f"segment: {n} documents enter it with the content they had (other injections, or merged)")


def write_segment(b: Build, entering: DataFrame, rows: int | None, whole_analysis: bool = False) -> dict:
    """Doc ordinals, segment_docs and the postings of the documents entering segment `b.version`; with
    `whole_analysis` they are every document with a kept analysis and no injected terms."""
    if whole_analysis:
        wide = _analyses(b).select("*", *[_not_injected(c).alias(c) for c in INJECTED_COLUMNS])
    else:
        wide = _analysis_of(b, entering, rows)
    wide = wide.withColumn("shard", (F.col("doc_hash") % b.num_shards).cast("int"))
    wide = wide.withColumn("doc_len", (F.col("doc_len") + F.coalesce(
        F.aggregate("inj_tfs", F.lit(0), lambda acc, x: acc + x), F.lit(0))).cast("int"))
    ordinal = F.row_number().over(Window.partitionBy("shard").orderBy("doc_id")) - 1
    seg = b.keep(wide.withColumn("doc_ord", ordinal.cast("int"))
                 .withColumn("block", (F.col("doc_ord") / tables.POSTINGS_BLOCK_DOCS).cast("int")))
    expected, got = rows if rows is not None else entering.count(), seg.count()
    if got != expected:
        raise RuntimeError(f"{tables.DOC_ANALYSIS} holds {got} analyses for the {expected} documents entering segment "
                           f"{b.version} (analyzer {b.analyzer_key}): a row is missing or repeated")
    v = F.lit(b.version).cast("long").alias("segment")
    docs_version = _replace(seg.select(v, *[c for c in tables.SEGMENT_DOCS_SCHEMA.names if c != "segment"]),
                            b.uri(tables.SEGMENT_DOCS), "segment", b.version, ["segment", "shard"], evolve=True)
    postings = (seg.select("shard", "block", "doc_ord", "term_ids", "tfs", "inj_term_ids", "inj_tfs")
                .groupBy("shard", "block").applyInArrow(invert_block, spark_ddl(POSTINGS_OUT)))
    postings_version = _replace(postings.select(v, *POSTINGS_OUT.names), b.uri(tables.SEGMENT_POSTINGS),
                                "segment", b.version, ["segment", "shard"])
    return {"seg": seg, "segment_docs_table_version": docs_version,
            "segment_postings_table_version": postings_version}


def _final_vectors(b: Build, rows: DataFrame) -> DataFrame:
    """(doc_id, term_id, tf) of documents as indexed: their analysis plus their injected terms."""
    return (_term_counts(rows).unionByName(_term_counts(rows.where(F.col("inj_term_ids").isNotNull()),
                                                        "inj_term_ids", "inj_tfs"))
            .groupBy("doc_id", "term_id").agg(F.sum("tf").alias("tf")))


def _term_stats_rows(b: Build, version: dict) -> DataFrame:
    """The term_stats rows of the versions `version` lists in its term_stats_versions, not yet summed."""
    return b.read(tables.TERM_STATS).where(F.col("index_version").isin(tables.term_stats_versions_of(version))) \
        .drop("index_version")


def base_term_stats(b: Build, version: dict) -> DataFrame:
    """(term_id, term, df, df_enriched, cf) of every term of the published `version` (its rows summed when it lists
    several term_stats_versions)."""
    rows = _term_stats_rows(b, version)
    if len(tables.term_stats_versions_of(version)) == 1:
        return rows
    return rows.groupBy("term_id").agg(F.min("term").alias("term"), *[F.sum(c).alias(c) for c in (
        "df", "df_enriched", "cf")]).where(F.col("df_enriched") > 0)


def term_statistics(b: Build, plan: SegmentPlan, seg: dict, orig_df: DataFrame | None,
                    orig_delta: DataFrame | None, max_versions: int) -> dict:
    """Write term_stats of the new version (df, df_enriched, cf): whole in a full build, and in an incremental one
    only what moved, as one more of its base's term_stats_versions (up to `max_versions`); returns its totals and
    its term_stats_versions."""
    dictionary = b.read(tables.TERM_DICTIONARY)
    entering = seg["seg"]
    if "carried" in entering.columns:  # merged documents stay with the statistics they have
        entering = entering.where(~F.col("carried"))
    if plan.base is None:
        postings = b.read(tables.SEGMENT_POSTINGS, seg["segment_postings_table_version"]).where(
            F.col("segment") == b.version)
        stats = (postings.select("term_id", "tfs").mapInArrow(posting_counts, spark_ddl(POSTING_COUNTS_OUT))
                 .groupBy("term_id").agg(F.sum("df").alias("df_enriched"), F.sum("cf").alias("cf")))
        stats = stats.join(orig_df, "term_id", "left") if orig_df is not None else stats.withColumn("df", F.col("df_enriched"))
        stats = stats.join(dictionary, "term_id", "left")
        total_terms = int(entering.agg(F.sum("doc_len")).first()[0] or 0)
    else:
        base = plan.base
        if b.changed is not None and b.enrichment is None and orig_delta is not None:
            # Plain: what entered and left is what came and went (`plan_segments`), whose counts `original_df` took.
            moved = orig_delta.withColumn("d_df_enriched", F.col("d_df"))
        else:
            leaving = _require_analysis(b, plan.leaving.select("doc_id", "content_hash", "inj_term_ids", "inj_tfs"),
                                        "documents leaving")
            moved = (_final_vectors(b, entering).withColumn("s", F.lit(1))
                     .unionByName(_final_vectors(b, leaving).withColumn("s", F.lit(-1)))
                     .groupBy("term_id").agg(F.sum("s").cast("long").alias("d_df_enriched"),
                                             F.sum(F.col("s") * F.col("tf")).cast("long").alias("d_cf")))
            moved = (moved.join(orig_delta.drop("d_cf"), "term_id", "full_outer") if orig_delta is not None
                     else moved.withColumn("d_df", F.lit(0).cast("long")))
        moved = b.cut(moved)
        n_moved = moved.count()
        zero = F.lit(0).cast("long")
        deltas = ("d_df", "d_df_enriched", "d_cf")
        rows = _term_stats_rows(b, base)
        # Each term that moved, with its df_enriched in the base (null: no row of the base's term_stats_versions
        # holds it). The few that moved go to every task and the base's rows stream past them (no shuffle of the
        # corpus-sized rows); their counts give the new version's number of terms: the base's, less those no
        # document holds any more, plus those some document holds now and none did.
        base_dfe = (rows.select("term_id", "df_enriched").join(_small(moved.select("term_id"), n_moved), "term_id")
                    .groupBy("term_id").agg(F.sum("df_enriched").alias("base_dfe")))
        met = b.cut(moved.join(_small(base_dfe, n_moved), "term_id", "left"))  # not kept: see `Build.cut`
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
            spelled = b.keep(_small(unseen, int(counts["unseen"])).join(dictionary, "term_id"))
            _require_spelled(spelled, int(counts["unseen"]))
            stats = (met.join(_small(spelled, int(counts["unseen"])), "term_id", "left")
                     .where(reduce(lambda a, c: a | (F.coalesce(c, zero) != 0), deltas, F.lit(False)))
                     .select("term_id", "term", *[F.coalesce(d, zero).alias(d[2:]) for d in deltas]))
            versions = [*versions, b.version]
        else:
            # The base's statistics with what moved (the few that moved go to every task), and the terms it did not
            # hold (no earlier counts: a term's df_enriched bounds its df and cf), spelled from the dictionary.
            def add(df: DataFrame) -> DataFrame:
                return df.select("term_id", "term", *[(F.coalesce(d[2:], zero) + F.coalesce(d, zero)).alias(d[2:])
                                                      for d in deltas])

            kept = add(base_term_stats(b, base).join(_small(moved, n_moved), "term_id", "left"))
            new = b.keep(_small(met.where(~held).drop("base_dfe"), int(counts["unheld"])).join(dictionary, "term_id"))
            _require_spelled(new, int(counts["unheld"]))
            new = add(new.select("term_id", "term", *[F.lit(None).cast("long").alias(d[2:]) for d in deltas], *deltas))
            stats = kept.unionByName(new).where(F.col("df_enriched") > 0)
            versions = [b.version]
        stats = _of_version(b, stats.withColumn("df", F.coalesce("df", F.lit(0)).cast("long")), tables.TERM_STATS_SCHEMA)
        if len(versions) > 1:  # only what moved: at most the moved terms
            stats = _in_files(stats, n_moved, TERM_ROWS_PER_FILE)
        version = _replace(stats, b.uri(tables.TERM_STATS), "index_version", b.version, ["index_version"])
        return {"table_version": version, "total_terms": total_terms, "num_terms": num_terms, "versions": versions}
    stats = b.keep(_of_version(b, stats.withColumn("df", F.coalesce("df", F.lit(0)).cast("long")),
                               tables.TERM_STATS_SCHEMA))
    unspelled = stats.where(F.col("term").isNull())  # counted first: see merge_dictionary
    unspelled = unspelled.limit(3).collect() if unspelled.count() else []
    if unspelled:
        raise RuntimeError(f"term ids {[r['term_id'] for r in unspelled]} are missing from {tables.TERM_DICTIONARY}")
    version = _replace(stats, b.uri(tables.TERM_STATS), "index_version", b.version, ["index_version"])
    return {"table_version": version, "total_terms": total_terms, "num_terms": stats.count(), "versions": [b.version]}


def _require_spelled(spelled: DataFrame, expected: int) -> None:
    got = spelled.count()
    if got != expected:
        raise RuntimeError(f"{expected - got} new terms are missing from {tables.TERM_DICTIONARY}")


def write_tombstones(b: Build, plan: SegmentPlan) -> int:
    rows = plan.tombstones if plan.tombstones is not None else b.spark.createDataFrame(
        [], spark_ddl(_without(tables.TOMBSTONES_SCHEMA, "index_version")))
    return _replace(_of_version(b, rows, tables.TOMBSTONES_SCHEMA), b.uri(tables.TOMBSTONES), "index_version",
                    b.version, ["index_version"])


def write_injections(b: Build, injections: DataFrame) -> int:
    """What the DF rule decided for every candidate phrase of the documents entering the new segment
    (sira.pipelines.hit_details reads it back)."""
    rows = injections.select(F.lit(b.version).cast("long").alias("segment"),
                             *tables.SEGMENT_INJECTIONS_SCHEMA.names[1:])
    return _replace(rows, b.uri(tables.SEGMENT_INJECTIONS), "segment", b.version, ["segment"])


def _of_version(b: Build, rows: DataFrame, schema: pa.Schema) -> DataFrame:
    """`rows` as rows of this build's version: its index_version, then the table's other columns in schema order."""
    return rows.select(F.lit(b.version).cast("long").alias("index_version"),
                       *[c for c in schema.names if c != "index_version"])


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
