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

# Written by the Spark index build; partitioned by (index_version[, shard]).
TERM_STATS_COLUMNS = ("index_version", "term_id", "term", "df", "cf")
POSTINGS_COLUMNS = ("index_version", "shard", "term_id", "df", "doc_ords", "tfs")
SHARD_DOCS_COLUMNS = ("index_version", "shard", "doc_ord", "doc_id", "doc_len")
# One row per published index version, written last: its presence is what makes a version visible.
CORPUS_STATS_COLUMNS = (
    "index_version", "preset", "num_docs", "avgdl", "total_terms", "num_terms", "num_shards", "k1", "b",
    "max_n", "analyzer_json", "docs_table_version", "term_stats_table_version", "postings_table_version",
    "shard_docs_table_version", "built_at",
)


def table_uri(warehouse: str, name: str) -> str:
    return warehouse.rstrip("/") + "/" + name
