"""Warehouse layout and Delta table schemas. Every table lives at WAREHOUSE/<name>."""

from __future__ import annotations

import pyarrow as pa

DOCS = "docs"
REJECTED = "rejected"
TERM_STATS = "term_stats"
CORPUS_STATS = "corpus_stats"

DOCS_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("ingested_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

REJECTED_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("record", pa.int64(), nullable=False),  # 1-based line / row number in the source
        pa.field("doc_id", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string()),  # the record as read, cut to RAW_KEEP_CHARS
        pa.field("rejected_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
RAW_KEEP_CHARS = 2000

ENRICHMENT = "enrichment"
INJECTIONS = "injections"  # per version, written by builds before SEGMENT_INJECTIONS (still read for those)

# Written by `sira enrich`, keyed by (doc_id, content_hash, model, prompt_version).
ENRICHMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
        pa.field("backend", pa.string(), nullable=False),
        pa.field("phrases", pa.list_(pa.string())),
        pa.field("weights", pa.list_(pa.float32())),  # the proposer's confidence per phrase; null: 1 each (LLMs)
        pa.field("raw_output", pa.string()),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("latency_ms", pa.float64()),
        pa.field("error", pa.string()),
        pa.field("enriched_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
ENRICHMENT_KEY = ("doc_id", "content_hash", "model", "prompt_version")

# Written by query expansion, cached by query text: keyed by (query_hash, model, prompt_version).
EXPANSIONS = "expansions"
EXPANSIONS_SCHEMA = pa.schema(
    [pa.field("query_hash", pa.string(), nullable=False), pa.field("query", pa.string(), nullable=False)]
    + [f for f in ENRICHMENT_SCHEMA if f.name not in ("doc_id", "content_hash")]
)
EXPANSIONS_KEY = ("query_hash", "model", "prompt_version")

# Written by the sira+rerank variant: one LLM relevance judgment (0-100) per (query text, doc content, model,
# prompt version); an errored judgment is retried by the next run.
RERANK = "rerank_judgments"
RERANK_SCHEMA = pa.schema(
    [pa.field("query_hash", pa.string(), nullable=False), pa.field("query", pa.string(), nullable=False),
     pa.field("doc_id", pa.string(), nullable=False), pa.field("content_hash", pa.string(), nullable=False),
     pa.field("model", pa.string(), nullable=False), pa.field("prompt_version", pa.string(), nullable=False),
     pa.field("backend", pa.string(), nullable=False), pa.field("score", pa.int32())]
    + [f for f in ENRICHMENT_SCHEMA if f.name in ("raw_output", "input_tokens", "output_tokens", "latency_ms", "error")]
    + [pa.field("judged_at", pa.timestamp("us", tz="UTC"), nullable=False)]
)
RERANK_KEY = ("query_hash", "doc_id", "content_hash", "model", "prompt_version")

# The encoder proposer's vocabulary: entries of one index version and their embeddings (partitioned by version).
VOCABULARY = "vocabulary"
VOCABULARY_SCHEMA = pa.schema(
    [
        pa.field("index_version", pa.int64(), nullable=False),
        pa.field("vocabulary_key", pa.string(), nullable=False),  # hash of the membership settings
        pa.field("encoder", pa.string(), nullable=False),
        pa.field("term", pa.string(), nullable=False),
        pa.field("surface", pa.string(), nullable=False),
        pa.field("df", pa.int64(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),
    ]
)

# A sentence encoder's vector of each document's content (the dense variants' corpus side), keyed by (doc_id,
# content_hash, encoder): a changed document gets a new row, an unchanged one keeps its vector across nights.
# `encoder` names the model and its input length (two lengths make two vectors).
DOC_EMBEDDINGS = "doc_embeddings"
DOC_EMBEDDINGS_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("encoder", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # unit length
        pa.field("embedded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
DOC_EMBEDDINGS_KEY = ("doc_id", "content_hash", "encoder")

# Facts about the warehouse recorded when its corpus is ingested (e.g. `task`: the prompt task of its dataset), so
# later jobs read them instead of guessing from the warehouse's name. Key: key.
WAREHOUSE_INFO = "warehouse_info"
WAREHOUSE_INFO_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # the ingest source that set it
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# Written by `sira query`: one row per (run_id, qid), the retrieval program included.
RUNS = "runs"
RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),  # the query's 1-based line (or row) in the query file
        pa.field("qid", pa.string(), nullable=False),
        pa.field("query", pa.string(), nullable=False),  # a rejected line: the line as read, cut to RAW_KEEP_CHARS
        pa.field("program", pa.string(), nullable=False),  # RetrievalProgram JSON ("" for a rejected line)
        pa.field("program_id", pa.string(), nullable=False),  # a hash of `program`, the Parquet run's link to it
        pa.field("doc_ids", pa.list_(pa.string()), nullable=False),
        pa.field("scores", pa.list_(pa.float32()), nullable=False),
        pa.field("index_version", pa.int64(), nullable=False),
        pa.field("error", pa.string()),  # why the line was rejected; None for a scored query
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
RUNS_KEY = ("run_id", "qid")

# ---- The Spark index build (sira.pipelines.index) -------------------------------------------------------------
# Layout 2: an index version is a list of immutable segments (each one build's documents, with their own doc
# ordinals and postings) minus the version's tombstones, plus its own term statistics. A night indexes only the
# documents that changed into a new segment; a full build (or a compaction) writes one segment with everything.
INDEX_LAYOUT = 2

# Each document's analysis, kept across builds: a night re-analyses only new or changed documents.
# Key (analyzer_key, doc_id, content_hash); partitioned by analyzer_key. term_ids ascending, one tf each.
DOC_ANALYSIS = "doc_analysis"
DOC_ANALYSIS_SCHEMA = pa.schema([
    ("analyzer_key", pa.string()), ("doc_id", pa.string()), ("content_hash", pa.string()),
    ("doc_hash", pa.int64()),  # sira.core.hashing.doc_hash: shard = doc_hash % shards
    ("doc_len", pa.int32()), ("term_ids", pa.list_(pa.int64())), ("tfs", pa.list_(pa.int32())),
])
# The enrichment phrases of each document after the checks that need only its text (sira.core.dfstats
# .phrase_candidates); `reason` null: the DF rule decides at each build. Key (analyzer_key, doc_id,
# content_hash, phrases_key).
PHRASE_ANALYSIS = "phrase_analysis"
CANDIDATE_TYPE = pa.struct([("phrase", pa.string()), ("reason", pa.string()),
                            ("term_ids", pa.list_(pa.int64())), ("tfs", pa.list_(pa.int32()))])
PHRASE_ANALYSIS_SCHEMA = pa.schema([
    ("analyzer_key", pa.string()), ("doc_id", pa.string()), ("content_hash", pa.string()),
    ("phrases_key", pa.string()), ("candidates", pa.list_(CANDIDATE_TYPE)),
])
# Every term id ever indexed and its spelling (the index-time collision check reads it).
TERM_DICTIONARY = "term_dictionary"
TERM_DICTIONARY_SCHEMA = pa.schema([("term_id", pa.int64()), ("term", pa.string())])
# Per segment and shard: doc ordinals follow doc-id order. inj_*: the enrichment terms injected into the doc
# (added to its analysis), inject_key their hash; decisions_key hashes the DF rule's decision on each of its
# candidate phrases (position, phrase, kept, reason), of which phrases_proposed were decided and phrases_kept kept
# ("" and 0 in a plain index; null in segments written before these columns). A doc whose decisions change moves
# to a new segment.
SEGMENT_DOCS = "segment_docs"
SEGMENT_DOCS_SCHEMA = pa.schema([
    ("segment", pa.int64()), ("shard", pa.int32()), ("doc_ord", pa.int32()), ("doc_id", pa.string()),
    ("content_hash", pa.string()), ("doc_len", pa.int32()), ("inject_key", pa.string()),
    ("inj_term_ids", pa.list_(pa.int64())), ("inj_tfs", pa.list_(pa.int32())),
    ("decisions_key", pa.string()), ("phrases_proposed", pa.int32()), ("phrases_kept", pa.int32()),
])
# Postings of one term in one block of POSTINGS_BLOCK_DOCS doc ordinals: no row holds a long posting list.
SEGMENT_POSTINGS = "segment_postings"
SEGMENT_POSTINGS_SCHEMA = pa.schema([
    ("segment", pa.int64()), ("shard", pa.int32()), ("term_id", pa.int64()), ("block", pa.int32()),
    ("doc_ords", pa.list_(pa.int32())), ("tfs", pa.list_(pa.int32())),
])
POSTINGS_BLOCK_DOCS = 32_768
# Documents of a version's segments that the version no longer holds (deleted, changed, re-injected).
TOMBSTONES = "tombstones"
TOMBSTONES_SCHEMA = pa.schema([("index_version", pa.int64()), ("segment", pa.int64()), ("shard", pa.int32()),
                               ("doc_ord", pa.int32())])
# A version's term statistics are the sum of the rows of the versions its corpus_stats row lists in
# `term_stats_versions` (`term_stats_versions_of`): the first holds some version's whole statistics, each later one
# what one incremental build changed (differences, which may be negative; `term` spelled where no earlier row of the
# list spells it). A term belongs to the version while its summed df_enriched is positive. A night so rewrites the
# few terms that moved, not the corpus' millions.
TERM_STATS_SCHEMA = pa.schema([("index_version", pa.int64()), ("term_id", pa.int64()), ("term", pa.string()),
                               ("df", pa.int64()), ("df_enriched", pa.int64()), ("cf", pa.int64())])
INJECTIONS_SCHEMA = pa.schema([("index_version", pa.int64()), ("doc_id", pa.string()), ("position", pa.int32()),
                               ("phrase", pa.string()), ("kept", pa.bool_()), ("reason", pa.string()),
                               ("min_df", pa.int64())])
# The DF rule's decision on every candidate phrase of the documents that entered a segment, kept with the segment: a
# version's decisions are those of each live document's segment (the newest of the version's segments that holds
# it). min_df is the smallest original-corpus DF of the phrase's terms when it was decided: later nights move DFs
# without moving a document whose decisions stay the same.
SEGMENT_INJECTIONS = "segment_injections"
SEGMENT_INJECTIONS_SCHEMA = pa.schema([("segment", pa.int64()), *[f for f in INJECTIONS_SCHEMA
                                                                  if f.name != "index_version"]])
# One row per published index version, written last: its presence is what makes a version visible.
CORPUS_STATS_SCHEMA = pa.schema([
    ("index_version", pa.int64()), ("preset", pa.string()), ("num_docs", pa.int64()), ("avgdl", pa.float64()),
    ("total_terms", pa.int64()), ("num_terms", pa.int64()), ("num_shards", pa.int32()), ("k1", pa.float64()),
    ("b", pa.float64()), ("max_n", pa.int32()), ("analyzer_json", pa.string()), ("enriched", pa.bool_()),
    ("enrichment_table_version", pa.int64()), ("tau", pa.float64()), ("phrases_proposed", pa.int64()),
    ("phrases_kept", pa.int64()), ("docs_table_version", pa.int64()), ("term_stats_table_version", pa.int64()),
    ("postings_table_version", pa.int64()), ("shard_docs_table_version", pa.int64()),
    ("injections_table_version", pa.int64()), ("built_at", pa.timestamp("us", tz="UTC")),
    ("enrichment_model", pa.string()), ("enrichment_prompt_version", pa.string()),  # the choice injected (null: newest)
    # Layout 2 (segments); the two *_table_version columns above belong to layout 1 and stay null.
    ("layout", pa.int32()), ("analyzer_key", pa.string()), ("segments", pa.list_(pa.int64())),
    ("base_version", pa.int64()), ("num_tombstones", pa.int64()), ("segment_docs_table_version", pa.int64()),
    ("segment_postings_table_version", pa.int64()), ("tombstones_table_version", pa.int64()),
    ("term_stats_versions", pa.list_(pa.int64())),  # see TERM_STATS_SCHEMA; null: [index_version]
    ("segment_injections_table_version", pa.int64()),  # enriched builds since SEGMENT_INJECTIONS (null before)
])
# The tables whose rows belong to one index version (retention deletes them with it, term_stats' once no kept
# version lists them in its term_stats_versions); segments go when no kept version lists them.
PER_VERSION_TABLES = (TERM_STATS, TOMBSTONES, INJECTIONS, VOCABULARY)
PER_SEGMENT_TABLES = (SEGMENT_DOCS, SEGMENT_POSTINGS, SEGMENT_INJECTIONS)
LAYOUT_1_TABLES = ("postings", "shard_docs")  # per version, in warehouses built before segments


def term_stats_versions_of(manifest: dict) -> list[int]:
    """The index versions whose term_stats rows add up to the statistics of the version of `manifest`."""
    return [int(v) for v in manifest.get("term_stats_versions") or [manifest["index_version"]]]


def table_uri(warehouse: str, name: str) -> str:
    return warehouse.rstrip("/") + "/" + name
