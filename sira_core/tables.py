"""Warehouse layout and Delta table schemas. Every table lives at WAREHOUSE/<name>."""

from __future__ import annotations

import pyarrow as pa

DOCS = "docs"
REJECTED = "rejected"
TERM_STATS = "term_stats"
CORPUS_STATS = "corpus_stats"
POSTINGS = "postings"
SHARD_DOCS = "shard_docs"

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
INJECTIONS = "injections"

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

# Written by `sira query`: one row per (run_id, qid), the retrieval program included.
RUNS = "runs"
RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("qid", pa.string(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("program", pa.string(), nullable=False),  # RetrievalProgram JSON
        pa.field("doc_ids", pa.list_(pa.string()), nullable=False),
        pa.field("scores", pa.list_(pa.float32()), nullable=False),
        pa.field("index_version", pa.int64(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
RUNS_KEY = ("run_id", "qid")

# Written by the Spark index build; partitioned by (index_version[, shard]).
TERM_STATS_COLUMNS = ("index_version", "term_id", "term", "df", "df_enriched", "cf")
POSTINGS_COLUMNS = ("index_version", "shard", "term_id", "df", "doc_ords", "tfs")
SHARD_DOCS_COLUMNS = ("index_version", "shard", "doc_ord", "doc_id", "doc_len")
INJECTIONS_COLUMNS = ("index_version", "doc_id", "position", "phrase", "kept", "reason", "min_df")
# One row per published index version, written last: its presence is what makes a version visible.
CORPUS_STATS_FIELDS = (
    ("index_version", "long"), ("preset", "string"), ("num_docs", "long"), ("avgdl", "double"),
    ("total_terms", "long"), ("num_terms", "long"), ("num_shards", "int"), ("k1", "double"), ("b", "double"),
    ("max_n", "int"), ("analyzer_json", "string"), ("enriched", "boolean"), ("enrichment_table_version", "long"),
    ("tau", "double"), ("phrases_proposed", "long"), ("phrases_kept", "long"), ("docs_table_version", "long"),
    ("term_stats_table_version", "long"), ("postings_table_version", "long"), ("shard_docs_table_version", "long"),
    ("injections_table_version", "long"), ("built_at", "timestamp"),
    ("enrichment_model", "string"), ("enrichment_prompt_version", "string"),  # the choice injected (null: newest)
)


def table_uri(warehouse: str, name: str) -> str:
    return warehouse.rstrip("/") + "/" + name
