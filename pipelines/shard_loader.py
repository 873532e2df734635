"""Load published index versions from Delta into in-memory shards, without a JVM (delta-rs + pyarrow)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.delta_io import read_table, table_exists
from pipelines.shard_cache import cached_shard
from sira_core import tables
from sira_core.analysis import Analyzer, AnalyzerConfig
from sira_core.bm25 import CorpusStats, ShardIndex
from sira_core.dfstats import DFTable
from sira_core.search import Searcher


class IndexNotFound(LookupError):
    pass


def published_versions(warehouse: str) -> list[dict]:
    """corpus_stats rows of every published index version, oldest first."""
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if not table_exists(uri):
        return []
    return sorted(read_table(uri).to_pylist(), key=lambda r: r["index_version"])


def find_index(warehouse: str, index_version: int | None = None, preset: str | None = None,
               enriched: bool | None = None) -> dict:
    """The requested version, or the newest published one matching `preset` / `enriched` when given."""
    rows = [
        r for r in published_versions(warehouse)
        if (index_version is None or r["index_version"] == index_version)
        and (preset is None or r["preset"] == preset)
        and (enriched is None or bool(r["enriched"]) == enriched)
    ]
    if not rows:
        wanted = {"version": index_version, "preset": preset, "enriched": enriched}
        what = ", ".join(f"{k} {v}" for k, v in wanted.items() if v is not None) or "at all"
        raise IndexNotFound(f"no published index ({what}) in warehouse {warehouse}; run `sira index`")
    return rows[-1]


def load_shard(warehouse: str, manifest: dict, shard: int) -> ShardIndex:
    v = manifest["index_version"]
    where = [("index_version", "=", v), ("shard", "=", shard)]
    docs = read_table(tables.table_uri(warehouse, tables.SHARD_DOCS), manifest["shard_docs_table_version"], where,
                      ["doc_ord", "doc_id", "doc_len"]).sort_by("doc_ord")
    ords = docs.column("doc_ord").to_numpy()
    if not np.array_equal(ords, np.arange(len(ords))):
        raise ValueError(f"index v{v} shard {shard}: doc ordinals are not 0..{len(ords) - 1}")
    post = read_table(tables.table_uri(warehouse, tables.POSTINGS), manifest["postings_table_version"], where,
                      ["term_id", "df", "doc_ords", "tfs"]).sort_by("term_id")
    doc_ords = post.column("doc_ords").combine_chunks() if post.num_rows else pa.array([], pa.list_(pa.int32()))
    tfs = post.column("tfs").combine_chunks() if post.num_rows else pa.array([], pa.list_(pa.int32()))
    lengths = pc.list_value_length(doc_ords).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    stats = CorpusStats(manifest["num_docs"], manifest["avgdl"], manifest["k1"], manifest["b"])
    return ShardIndex.from_postings(
        shard=shard,
        doc_ids=np.asarray(docs.column("doc_id").to_pylist(), dtype=object),
        doc_lens=docs.column("doc_len").to_numpy(),
        term_ids=post.column("term_id").to_numpy(),
        dfs=post.column("df").to_numpy(),
        postings_offsets=offsets,
        postings_ords=pc.list_flatten(doc_ords).to_numpy(zero_copy_only=False),
        postings_tfs=pc.list_flatten(tfs).to_numpy(zero_copy_only=False),
        stats=stats,
    )


def load_searcher(
    warehouse: str, index_version: int | None = None, preset: str | None = None, shards: Sequence[int] | None = None,
    enriched: bool | None = None,
) -> tuple[Searcher, dict]:
    """A searcher over all (or some) shards of one published index version, and its manifest row. Shards
    are memory-mapped from the local cache, which is written from Delta on first use (pipelines.shard_cache)."""
    manifest = find_index(warehouse, index_version, preset, enriched)
    wanted = range(manifest["num_shards"]) if shards is None else shards
    loaded = [cached_shard(warehouse, manifest, s, load_shard) for s in wanted]
    stats = CorpusStats(manifest["num_docs"], manifest["avgdl"], manifest["k1"], manifest["b"])
    analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
    return Searcher(loaded, stats, analyzer), manifest


def load_df_table(warehouse: str, manifest: dict) -> DFTable:
    """DF of every term of an index version, as the query-side filter sees it (DF in the indexed corpus,
    enrichment included)."""
    stats = read_table(tables.table_uri(warehouse, tables.TERM_STATS), manifest["term_stats_table_version"],
                       [("index_version", "=", manifest["index_version"])], ["term_id", "df_enriched"])
    return DFTable(stats.column("term_id").to_numpy(), stats.column("df_enriched").to_numpy(), manifest["num_docs"])
