"""The index build's Python workers (mapInArrow / applyInArrow): documents and enrichment phrases analysed,
postings inverted per block of doc ordinals, posting counts."""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from sira.core import tables
from sira.core.analysis import Analyzer, AnalyzerConfig, BatchAnalyzer, TermSet, index_text
from sira.core.dfstats import phrase_candidates
from sira.core.hashing import doc_hash, term_id
from sira.pipelines.index.context import without_fields


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
ANALYSIS_OUT = pa.schema([*without_fields(tables.DOC_ANALYSIS_SCHEMA, "analyzer_key"), *tables.TERM_DICTIONARY_SCHEMA])


CHANGES_ANALYSIS_OUT = pa.schema([*ANALYSIS_OUT, pa.field("sign", pa.int32())])  # a night's changes, analysed


PHRASES_OUT = pa.schema([*without_fields(tables.PHRASE_ANALYSIS_SCHEMA, "analyzer_key"),
                         *tables.TERM_DICTIONARY_SCHEMA])


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


POSTINGS_OUT = without_fields(tables.SEGMENT_POSTINGS_SCHEMA, "segment")


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
