"""Load published index versions from Delta into in-memory shards, without a JVM (delta-rs + pyarrow)."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.pipelines.delta_io import read_table, table_exists
from sira.pipelines.shard_cache import cached_shard
from sira.core import tables
from sira.core.analysis import Analyzer, AnalyzerConfig
from sira.core.bm25 import CorpusStats, ShardIndex
from sira.core.defaults import DEFAULT_TAU
from sira.core.dfstats import DFTable
from sira.core.query_path import QueryPath, Scorer
from sira.core.search import Searcher


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
    """The requested version, or the newest published one matching `preset` / `enriched` when given. Versions of
    an older index layout are not served (their term ids or tables differ): they count as absent."""
    rows = [
        r for r in published_versions(warehouse)
        if (index_version is None or r["index_version"] == index_version)
        and (preset is None or r["preset"] == preset)
        and (enriched is None or bool(r["enriched"]) == enriched)
    ]
    current = [r for r in rows if r.get("layout") == tables.INDEX_LAYOUT]
    if not current:
        wanted = {"version": index_version, "preset": preset, "enriched": enriched}
        what = ", ".join(f"{k} {v}" for k, v in wanted.items() if v is not None) or "at all"
        older = f" ({len(rows)} built with an older index layout, which this version cannot read)" if rows else ""
        raise IndexNotFound(f"no published index ({what}) in warehouse {warehouse}{older}; run `sira index`")
    return current[-1]


def load_shard(warehouse: str, manifest: dict, shard: int, dfs: DFTable | None = None) -> ShardIndex:
    """One shard of an index version as CSC arrays: the documents of its segments minus its tombstones, doc
    ordinals in doc-id order, each term's postings in ordinal order, impacts with the version's statistics."""
    v, segments = manifest["index_version"], sorted(manifest["segments"])
    where = [("segment", "in", segments), ("shard", "=", shard)]
    docs = read_table(tables.table_uri(warehouse, tables.SEGMENT_DOCS), manifest["segment_docs_table_version"], where,
                      ["segment", "doc_ord", "doc_id", "doc_len"])
    post = read_table(tables.table_uri(warehouse, tables.SEGMENT_POSTINGS), manifest["segment_postings_table_version"],
                      where, ["segment", "term_id", "block", "doc_ords", "tfs"])
    # Number every document of the shard's segments: segment by segment, each in its own ordinal order.
    seg_of_doc = np.searchsorted(segments, docs.column("segment").to_numpy())
    per_segment = np.bincount(seg_of_doc, minlength=len(segments))
    first = np.concatenate([[0], np.cumsum(per_segment)[:-1]])
    number = first[seg_of_doc] + docs.column("doc_ord").to_numpy()
    if not np.array_equal(np.sort(number), np.arange(docs.num_rows)):
        raise ValueError(f"index v{v} shard {shard}: segment doc ordinals are not 0..n-1 in each segment")
    alive = np.ones(docs.num_rows, dtype=bool)
    if manifest.get("num_tombstones"):
        dead = read_table(tables.table_uri(warehouse, tables.TOMBSTONES), manifest["tombstones_table_version"],
                          [("index_version", "=", v), ("shard", "=", shard)], ["segment", "doc_ord"])
        alive[first[np.searchsorted(segments, dead.column("segment").to_numpy())]
              + dead.column("doc_ord").to_numpy()] = False
    # The shard's ordinals follow doc-id order over the live documents (the merge tie-break depends on it).
    by_number = np.argsort(number)
    live_rows = by_number[alive[number[by_number]]]
    doc_ids = docs.column("doc_id").take(pa.array(live_rows))
    order = pc.sort_indices(doc_ids).to_numpy()
    live_rows, doc_ids = live_rows[order], doc_ids.take(pa.array(order))
    ordinal_of = np.full(docs.num_rows, -1, dtype=np.int64)
    ordinal_of[number[live_rows]] = np.arange(len(live_rows))

    lengths = pc.list_value_length(post.column("doc_ords")).to_numpy(zero_copy_only=False).astype(np.int64)
    row_first = first[np.searchsorted(segments, post.column("segment").to_numpy())]
    ords = ordinal_of[np.repeat(row_first, lengths) + _flat(post.column("doc_ords"))]
    # Postings by (term, ordinal) as one int64 key: the term's rank among the rows' terms above the ordinal. A file's
    # rows come by term and its blocks in ordinal order, so the keys arrive in a few ascending runs that a stable
    # sort (timsort) merges: 4-5x faster than sorting the pair of arrays.
    row_terms = post.column("term_id").to_numpy()
    term_ids, row_rank = np.unique(row_terms, return_inverse=True)
    ranks = np.repeat(row_rank.astype(np.int64), lengths)
    tfs = _flat(post.column("tfs"))
    kept = ords >= 0
    if not kept.all():
        ords, ranks, tfs = ords[kept], ranks[kept], tfs[kept]
    order = np.argsort((ranks << 32) | ords, kind="stable")
    ords, ranks, tfs = ords[order], ranks[order], tfs[order]
    starts = np.flatnonzero(np.concatenate([[True], ranks[1:] != ranks[:-1]])) if len(ranks) else np.empty(0, np.int64)
    term_ids = term_ids[ranks[starts]]
    dfs = dfs or load_df_table(warehouse, manifest)
    stats = CorpusStats(manifest["num_docs"], manifest["avgdl"], manifest["k1"], manifest["b"])
    return ShardIndex.from_postings(
        shard=shard,
        doc_ids=doc_ids,
        doc_lens=docs.column("doc_len").to_numpy()[live_rows],
        term_ids=term_ids,
        dfs=dfs.of_ids(term_ids, f"index v{v} shard {shard}"),
        postings_offsets=np.concatenate([starts, [len(ranks)]]).astype(np.int64),
        postings_ords=ords.astype(np.int32),
        postings_tfs=tfs,
        stats=stats,
    )


def _flat(column) -> np.ndarray:
    chunks = [pc.list_flatten(c).to_numpy(zero_copy_only=False) for c in column.chunks]
    return np.concatenate(chunks) if chunks else np.empty(0, np.int32)


def load_searcher(
    warehouse: str, index_version: int | None = None, preset: str | None = None, shards: Sequence[int] | None = None,
    enriched: bool | None = None,
) -> tuple[Searcher, dict]:
    """A searcher over all (or some) shards of one published index version, and its manifest row. Shards
    are memory-mapped from the local cache, which is written from Delta on first use (sira.pipelines.shard_cache)."""
    manifest = find_index(warehouse, index_version, preset, enriched)
    wanted = range(manifest["num_shards"]) if shards is None else shards
    dfs = lru_cache(maxsize=1)(lambda: load_df_table(warehouse, manifest))  # read once, and only on a cache miss
    loaded = [cached_shard(warehouse, manifest, s, lambda w, m, shard: load_shard(w, m, shard, dfs()))
              for s in wanted]
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
    enrichment included)."""
    stats = read_term_stats(warehouse, manifest, ["df_enriched"])
    return DFTable(stats.column("term_id").to_numpy(), stats.column("df_enriched").to_numpy(), manifest["num_docs"])


def load_query_path(warehouse: str, manifest: dict, scorer: Scorer, tau: float = DEFAULT_TAU,
                    expand: bool = False) -> QueryPath:
    """The query path of index version `manifest` over `scorer`; with `expand`, it reads the DFs that validate
    proposals."""
    analyzer = Analyzer(AnalyzerConfig.model_validate_json(manifest["analyzer_json"]))
    return QueryPath(scorer, analyzer, manifest["num_docs"], manifest["index_version"],
                     load_df_table(warehouse, manifest) if expand else None, tau)
