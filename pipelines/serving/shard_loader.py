"""Load published index versions from Delta into in-memory shards, without a JVM (delta-rs + pyarrow)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.pipelines.storage.delta_io import read_table, table_id
from sira.pipelines.serving.shard_cache import cached_segments, cached_shard, cached_term_stats
from sira.pipelines.index.catalog import find_index
from sira.core import tables
from sira.core.analysis import Analyzer, AnalyzerConfig
from sira.core.bm25 import CorpusStats, ShardIndex
from sira.core.defaults import DEFAULT_TAU
from sira.core.dfstats import DFTable
from sira.core.query_path import QueryPath, Scorer
from sira.core.segments import SegmentShard, assemble_shard, segment_from_rows, sum_by_term
from sira.core.search import Searcher


def load_shard(warehouse: str, manifest: dict, shard: int, dfs: DFTable | None = None) -> ShardIndex:
    """One shard of an index version as CSC arrays: the documents of its segments minus its tombstones, doc
    ordinals in doc-id order, each term's postings in ordinal order, impacts with the version's statistics. The
    segments come from the local cache (sira.pipelines.serving.shard_cache); only those it lacks are read from Delta."""
    v, segments = manifest["index_version"], sorted(manifest["segments"])
    parts = segment_shards(warehouse, manifest, shard)
    dead = [np.empty(0, np.int64) for _ in segments]
    if manifest.get("num_tombstones"):
        rows = read_table(tables.table_uri(warehouse, tables.TOMBSTONES), manifest["tombstones_table_version"],
                          [("index_version", "=", v), ("shard", "=", shard)], ["segment", "doc_ord"])
        seg, ords = rows.column("segment").to_numpy(), rows.column("doc_ord").to_numpy()
        unknown = np.setdiff1d(seg, segments)
        if len(unknown):
            raise ValueError(f"index v{v} shard {shard}: tombstones in segments {unknown.tolist()}, which the "
                             f"version does not hold")
        dead = [ords[seg == s] for s in segments]
    dfs = dfs or load_df_table(warehouse, manifest)
    stats = CorpusStats(manifest["num_docs"], manifest["avgdl"], manifest["k1"], manifest["b"])
    return assemble_shard(shard, parts, dead, dfs, stats, f"index v{v} shard {shard}")


def segment_shards(warehouse: str, manifest: dict, shard: int) -> list[SegmentShard]:
    """Shard `shard`'s part of each segment of the manifest's version (segment order), from the local cache;
    the segments it lacks are read from Delta together, then cached."""
    uri = tables.table_uri(warehouse, tables.SEGMENT_POSTINGS)
    table = table_id(uri, manifest["segment_postings_table_version"])
    return cached_segments(warehouse, table, sorted(manifest["segments"]), shard,
                           lambda missing: read_segments(warehouse, manifest, missing, shard))


def read_segments(warehouse: str, manifest: dict, segments: list[int], shard: int) -> dict[int, SegmentShard]:
    """Shard `shard`'s part of each of `segments`, read from Delta: Parquet decoded by Arrow's threads, the files of
    each (segment, shard) partition alone, no Python per row."""
    docs_uri, post_uri = (tables.table_uri(warehouse, t) for t in (tables.SEGMENT_DOCS, tables.SEGMENT_POSTINGS))
    out = {}
    for s in segments:
        where = [("segment", "=", s), ("shard", "=", shard)]
        docs = read_table(docs_uri, manifest["segment_docs_table_version"], where, ["doc_ord", "doc_id", "doc_len"])
        post = read_table(post_uri, manifest["segment_postings_table_version"], where,
                          ["term_id", "block", "doc_ords", "tfs"])
        out[s] = segment_from_rows(s, shard, docs, post)
    return out


def load_searcher(
    warehouse: str, index_version: int | None = None, preset: str | None = None, shards: Sequence[int] | None = None,
    enriched: bool | None = None,
) -> tuple[Searcher, dict]:
    """A searcher over all (or some) shards of one published index version, and its manifest row. Shards
    are memory-mapped from the local cache, which is written from Delta on first use (sira.pipelines.serving.shard_cache)."""
    manifest = find_index(warehouse, index_version, preset, enriched)
    wanted = range(manifest["num_shards"]) if shards is None else shards
    dfs = lru_cache(maxsize=1)(lambda: load_df_table(warehouse, manifest))  # read once, and only on a cache miss
    # A shard per core at a time: Arrow's reads and the numba kernels release the GIL.
    with ThreadPoolExecutor(max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        loaded = list(pool.map(lambda s: cached_shard(warehouse, manifest, s, lambda w, m, shard: load_shard(
            w, m, shard, dfs())), wanted))
    stats = CorpusStats(manifest["num_docs"], manifest["avgdl"], manifest["k1"], manifest["b"])
    analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
    return Searcher(loaded, stats, analyzer), manifest


def read_term_stats(warehouse: str, manifest: dict, columns: Sequence[str] = ("term", "df", "df_enriched", "cf")
                    ) -> pa.Table:
    """(term_id, *columns) of every term of the index version of `manifest`: its term_stats rows, summed over its
    term_stats_versions when an incremental build wrote only what changed (sira.core.tables.TERM_STATS_SCHEMA)."""
    uri, version = tables.table_uri(warehouse, tables.TERM_STATS), manifest["term_stats_table_version"]
    versions = tables.term_stats_versions_of(manifest)
    if len(versions) == 1:
        return read_table(uri, version, [("index_version", "=", versions[0])], ["term_id", *columns])
    counts = [c for c in ("df", "df_enriched", "cf") if c in columns or c == "df_enriched"]
    rows = pa.concat_tables(read_table(uri, version, [("index_version", "=", v)], ["term_id", *columns, *(
        c for c in counts if c not in columns)]) for v in versions)  # in the order of `versions`
    if rows.num_rows == 0:
        return rows.select(["term_id", *columns])
    # A stable sort by term id keeps each term's rows in version order, so its first row is the one that spells it
    # (a later row spells only a term no earlier one holds); the counts are summed per run of equal ids.
    ids = rows.column("term_id").to_numpy()
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    summed = {c: np.add.reduceat(rows.column(c).to_numpy()[order], starts) for c in counts}
    held = summed["df_enriched"] > 0
    first = pa.array(order[starts[held]])
    return pa.table({"term_id": ids[starts[held]], **{
        c: summed[c][held] if c in summed else rows.column(c).take(first) for c in columns}})


def load_df_table(warehouse: str, manifest: dict) -> DFTable:
    """DF of every term of an index version, as the query-side filter sees it (DF in the indexed corpus,
    enrichment included): the sum over its term-statistics versions, each from the local cache (read from Delta
    once)."""
    uri, version = tables.table_uri(warehouse, tables.TERM_STATS), manifest["term_stats_table_version"]

    def read(missing: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        rows = read_table(uri, version, [("index_version", "in", missing)], ["index_version", "term_id", "df_enriched"])
        out = {}
        for v in missing:
            mine = rows.filter(pc.equal(rows.column("index_version"), v)) if len(missing) > 1 else rows
            ids = mine.column("term_id").to_numpy()
            order = np.argsort(ids, kind="stable")
            out[v] = ids[order], mine.column("df_enriched").to_numpy()[order]
        return out

    parts = cached_term_stats(warehouse, table_id(uri, version), tables.term_stats_versions_of(manifest), read)
    term_ids, dfs = sum_by_term(parts)
    held = dfs > 0  # a term belongs to the version while its summed DF is positive (sira.core.tables)
    return DFTable(term_ids[held], dfs[held], manifest["num_docs"])


def load_query_path(warehouse: str, manifest: dict, scorer: Scorer, tau: float = DEFAULT_TAU,
                    expand: bool = False) -> QueryPath:
    """The query path of index version `manifest` over `scorer`; with `expand`, it reads the DFs that validate
    proposals."""
    analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
    return QueryPath(scorer, analyzer, manifest["num_docs"], manifest["index_version"],
                     load_df_table(warehouse, manifest) if expand else None, tau)
