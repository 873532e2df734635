"""A version's shard assembled from segments (sira.core.segments) equals the same documents indexed at once: rows
in any order become one ordered segment, and merging segments minus their dead documents renumbers the live ones
in doc-id order with each term's postings in ordinal order."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sira.core import bm25
from sira.core.bm25 import CorpusStats, ShardIndex
from sira.core.dfstats import DFTable
from sira.core.segments import SegmentShard, assemble_shard, segment_from_rows, sum_by_term

STATS = CorpusStats(num_docs=1000, avgdl=6.5, k1=1.2, b=0.75)


def random_segment(rng, segment: int, doc_ids: list[str], vocab: int = 40, block: int = 7) -> tuple[dict, pa.Table,
                                                                                                     pa.Table]:
    """(doc id -> {term: tf}) of random documents, and their rows as a build writes them: per block of `block`
    ordinals one row per term, rows shuffled."""
    doc_ids = sorted(doc_ids)
    vectors = {d: {int(t): int(rng.integers(1, 4)) for t in rng.choice(vocab, size=rng.integers(1, 8), replace=False)}
               for d in doc_ids}
    docs = pa.table({"doc_ord": pa.array(np.arange(len(doc_ids)), pa.int32()), "doc_id": doc_ids,
                     "doc_len": pa.array([sum(v.values()) for v in vectors.values()], pa.int32())})
    rows = {}
    for ord_, d in enumerate(doc_ids):
        for t, tf in vectors[d].items():
            rows.setdefault((t * 1000 - 7, ord_ // block), []).append((ord_, tf))
    keys = list(rows)
    rng.shuffle(keys)
    postings = pa.table({
        "term_id": pa.array([k[0] for k in keys], pa.int64()), "block": pa.array([k[1] for k in keys], pa.int32()),
        "doc_ords": pa.array([[o for o, _ in rows[k]] for k in keys], pa.list_(pa.int32())),
        "tfs": pa.array([[tf for _, tf in rows[k]] for k in keys], pa.list_(pa.int32()))})
    return {d: {t * 1000 - 7: tf for t, tf in v.items()} for d, v in vectors.items()}, docs.take(
        pa.array(rng.permutation(len(doc_ids)))), postings


def postings_of(doc_ids, term_ids, indptr, ords, tfs) -> dict:
    """doc id -> {term: tf}, from CSC arrays; checks each term's ordinals ascend."""
    out = {d: {} for d in doc_ids}
    for row, t in enumerate(term_ids):
        lo, hi = indptr[row], indptr[row + 1]
        assert hi > lo and np.all(np.diff(ords[lo:hi]) > 0)
        for o, tf in zip(ords[lo:hi], tfs[lo:hi]):
            out[doc_ids[o]][int(t)] = int(tf)
    return out


def dfs_of(term_ids):
    return (np.asarray(term_ids) % 97 + 1).astype(np.int64)  # any DFs: the same for both sides


def df_table(parts) -> DFTable:
    """Any DFs for the terms of `parts` (the same for both sides of a comparison)."""
    ids = np.unique(np.concatenate([p.term_ids for p in parts]))
    return DFTable(ids, dfs_of(ids), STATS.num_docs)


def indexed_at_once(vectors: dict) -> ShardIndex:
    """The shard a full build would make of `vectors` (doc id -> {term: tf})."""
    doc_ids = sorted(vectors)
    terms = sorted({t for v in vectors.values() for t in v})
    ords, tfs, indptr = [], [], [0]
    for t in terms:
        for o, d in enumerate(doc_ids):
            if t in vectors[d]:
                ords.append(o)
                tfs.append(vectors[d][t])
        indptr.append(len(ords))
    return ShardIndex.from_postings(0, doc_ids, np.array([sum(vectors[d].values()) for d in doc_ids], np.int32),
                                    np.array(terms, np.int64), dfs_of(terms), np.array(indptr),
                                    np.array(ords, np.int32), np.array(tfs, np.int32), STATS)


def test_rows_in_any_order_make_one_ordered_segment():
    rng = np.random.default_rng(1)
    vectors, docs, postings = random_segment(rng, 4, [f"d{i:03d}" for i in range(60)])
    part = segment_from_rows(4, 0, docs, postings)
    assert part.doc_ids.to_pylist() == sorted(vectors)
    assert np.all(np.diff(part.term_ids) > 0)
    assert postings_of(part.doc_ids.to_pylist(), part.term_ids, part.indptr, part.doc_ords, part.tfs) == vectors
    again = SegmentShard.from_arrays(4, 0, part.arrays())
    assert again.doc_ids.to_pylist() == part.doc_ids.to_pylist() and np.array_equal(again.tfs, part.tfs)


def test_rows_read_in_batches_are_placed_from_each_batch():
    """Postings read from Parquet arrive as record batches (chunks, sliced list arrays): each row is placed from
    its batch's buffers, also when the two list columns are chunked differently."""
    rng = np.random.default_rng(3)
    vectors, docs, postings = random_segment(rng, 6, [f"d{i:03d}" for i in range(80)])
    batched = pa.Table.from_batches(postings.to_batches(max_chunksize=7))
    assert batched.column("doc_ords").num_chunks > 1 and batched.column("doc_ords").chunk(1).offsets[0].as_py() > 0
    uneven = batched.set_column(3, "tfs", pa.chunked_array([postings.column("tfs").combine_chunks().slice(0, 10),
                                                            postings.column("tfs").combine_chunks().slice(10)]))
    whole = segment_from_rows(6, 0, docs, postings)
    for rows in (batched, uneven):
        part = segment_from_rows(6, 0, docs, rows)
        assert np.array_equal(part.doc_ords, whole.doc_ords) and np.array_equal(part.tfs, whole.tfs)
        assert postings_of(part.doc_ids.to_pylist(), part.term_ids, part.indptr, part.doc_ords, part.tfs) == vectors
    unequal = postings.set_column(3, "tfs", pa.array([[1] * (len(o) + 1) for o in postings.column("doc_ords")
                                                      .to_pylist()], pa.list_(pa.int32())))
    with pytest.raises(ValueError, match="segment 6 shard 0: postings rows hold different numbers"):
        segment_from_rows(6, 0, docs, unequal)


def test_a_repeated_block_is_named():
    rng = np.random.default_rng(2)
    _, docs, postings = random_segment(rng, 5, [f"d{i}" for i in range(20)])
    with pytest.raises(ValueError, match=r"segment 5 shard 0: the postings of term -?\d+ are not ascending"):
        segment_from_rows(5, 0, docs, pa.concat_tables([postings, postings.slice(0, 1)]))
    with pytest.raises(ValueError, match="segment 5 shard 0: the ordinals of its 19 documents are not 0..18"):
        segment_from_rows(5, 0, docs.slice(1), postings)


@pytest.mark.parametrize("n_segments", [1, 2, 5])
def test_merged_segments_equal_their_live_documents_indexed_at_once(n_segments, monkeypatch):
    monkeypatch.setattr(bm25.shard, "TIER_MIN_POSTINGS", 16)  # long lists are stored in two tiers: split in place here
    rng = np.random.default_rng(n_segments)
    names = [f"doc-{i:04d}" for i in rng.permutation(400)]
    cuts = np.sort(rng.choice(np.arange(1, 400), n_segments - 1, replace=False))
    parts, dead, expected = [], [], {}
    for s, ids in enumerate(np.split(np.array(names), cuts)):
        vectors, docs, postings = random_segment(rng, s, list(ids))
        part = segment_from_rows(s, 0, docs, postings)
        gone = np.flatnonzero(rng.random(part.num_docs) < 0.2)
        parts.append(part)
        dead.append(gone)
        expected.update({d: v for i, (d, v) in enumerate(sorted(vectors.items())) if i not in set(gone)})
    got, want = assemble_shard(0, parts, dead, df_table(parts), STATS), indexed_at_once(expected)
    assert len(want.tier_rows)
    for name, array in want.arrays().items():
        assert np.array_equal(got.arrays()[name], array), name


def two_parts() -> tuple[SegmentShard, SegmentShard]:
    """Segment 1 holds a (term 5, term 9) and c (term 9), segment 2 holds b (term 9)."""
    one = SegmentShard(1, 0, pa.array(["a", "c"], pa.large_string()), np.array([1, 1], np.int32),
                       np.array([5, 9]), np.array([0, 1, 2]), np.array([0, 1], np.int32), np.array([1, 1], np.int32))
    two = SegmentShard(2, 0, pa.array(["b"], pa.large_string()), np.array([2], np.int32),
                       np.array([9]), np.array([0, 1]), np.array([0], np.int32), np.array([2], np.int32))
    return one, two


def test_a_term_whose_documents_all_died_is_dropped():
    one, two = two_parts()
    got = assemble_shard(0, [one, two], [np.array([0]), np.array([], np.int64)], DFTable(np.array([9]), dfs_of([9]), 2), STATS)
    want = indexed_at_once({"b": {9: 2}, "c": {9: 1}})
    assert got.doc_ids.to_pylist() == ["b", "c"] and got.term_ids.tolist() == [9]
    for name, array in want.arrays().items():
        assert np.array_equal(got.arrays()[name], array), name


def test_a_term_with_live_postings_and_no_df_is_named():
    one, two = two_parts()
    with pytest.raises(ValueError, match="index v3 shard 0: term 5 has postings but no term statistics"):
        assemble_shard(0, [one, two], [np.array([], np.int64)] * 2, DFTable(np.array([9]), dfs_of([9]), 3), STATS,
                       "index v3 shard 0")


def test_statistics_sum_over_their_versions():
    whole = (np.array([1, 4, 8, 11]), np.array([3, 2, 5, 1]))
    night = (np.array([2, 4, 12]), np.array([1, -2, 1]))
    later = (np.array([0, 2, 13]), np.array([1, 1, 1]))
    ids, counts = sum_by_term([whole, night, later])
    assert ids.tolist() == [0, 1, 2, 4, 8, 11, 12, 13] and counts.tolist() == [1, 3, 2, 0, 5, 1, 1, 1]
