"""A version's shard assembled from its segments' raw postings, in linear time.

An index version is a list of immutable segments minus its tombstones (sira.core.tables, layout 2). A segment's part
of a shard (`SegmentShard`) is the same in every version that holds it: its documents in their segment ordinals
(doc-id order) and each term's postings with raw tfs. Only the assembly depends on the version: the live documents
renumbered in doc-id order over all segments, each term's postings merged in that order (`merge_segments`), then
the version's statistics turn tfs into impacts (ShardIndex.from_postings). A searcher that follows a night so
reads only the new segment and merges, instead of reading and sorting every posting again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sira.core.bm25 import (IMPACT_DTYPE, CorpusStats, ShardIndex, as_doc_id_array, doc_id_buffers,
                            doc_ids_from_buffers, idf)
from sira.core.dfstats import DFTable


@dataclass(frozen=True, eq=False)
class SegmentShard:
    """One segment's documents and postings in one shard: ordinal i is doc_ids[i] (sorted); each term's postings
    are ascending ordinals with their tfs."""

    segment: int
    shard: int
    doc_ids: pa.LargeStringArray
    doc_lens: np.ndarray  # int32
    term_ids: np.ndarray  # int64, strictly increasing
    indptr: np.ndarray  # int64 [terms + 1]
    doc_ords: np.ndarray  # int32
    tfs: np.ndarray  # int32

    def __post_init__(self):
        where = f"segment {self.segment} shard {self.shard}"
        if len(self.doc_ids) != len(self.doc_lens):
            raise ValueError(f"{where}: {len(self.doc_ids)} doc ids but {len(self.doc_lens)} lengths")
        if len(self.indptr) != len(self.term_ids) + 1 or self.indptr[-1] != len(self.doc_ords) \
                or len(self.doc_ords) != len(self.tfs):
            raise ValueError(f"{where}: inconsistent postings arrays")

    @property
    def num_docs(self) -> int:
        return len(self.doc_ids)

    def arrays(self) -> dict[str, np.ndarray]:
        offsets, data = doc_id_buffers(self.doc_ids)
        return {"doc_id_offsets": offsets, "doc_id_data": data, "doc_lens": self.doc_lens,
                "term_ids": self.term_ids, "indptr": self.indptr, "doc_ords": self.doc_ords, "tfs": self.tfs}

    @classmethod
    def from_arrays(cls, segment: int, shard: int, arrays: dict[str, np.ndarray]) -> "SegmentShard":
        """The inverse of arrays(), without copying them (they may be memory maps)."""
        return cls(segment, shard, doc_ids_from_buffers(arrays["doc_id_offsets"], arrays["doc_id_data"]),
                   arrays["doc_lens"], arrays["term_ids"], arrays["indptr"], arrays["doc_ords"], arrays["tfs"])


def segment_from_rows(segment: int, shard: int, docs: pa.Table, postings: pa.Table) -> SegmentShard:
    """A SegmentShard from its rows as the build stores them: `docs` (doc_ord, doc_id, doc_len) and `postings`
    (term_id, block, doc_ords, tfs), one row per term and block of ordinals with ascending ordinals, rows in any
    order. Sorting the rows (not the postings) by (term, block) puts every term's postings in ordinal order."""
    where = f"segment {segment} shard {shard}"
    ords = docs.column("doc_ord").to_numpy()
    n = len(ords)
    by_ord = np.argsort(ords, kind="stable")
    if n and not np.array_equal(ords[by_ord], np.arange(n)):
        raise ValueError(f"{where}: the ordinals of its {n} documents are not 0..{n - 1}")
    doc_ids = as_doc_id_array(docs.column("doc_id").take(pa.array(by_ord)))
    doc_lens = docs.column("doc_len").to_numpy()[by_ord].astype(np.int32)

    terms = postings.column("term_id").to_numpy()
    blocks = postings.column("block").to_numpy()
    # Blocks come in runs and each block's rows by term: two stable sorts (timsort merges runs) beat a lexsort.
    by_block = np.argsort(blocks, kind="stable")
    order = by_block[np.argsort(terms[by_block], kind="stable")]
    chunks = _list_chunks(postings.column("doc_ords"), postings.column("tfs"), where)
    lengths = np.concatenate([np.diff(chunk[0]) for chunk in chunks] or [np.empty(0, np.int64)])
    indptr_rows = np.zeros(len(order) + 1, np.int64)
    np.cumsum(lengths[order], out=indptr_rows[1:])
    out_ords = np.empty(indptr_rows[-1], np.int32)
    out_tfs = np.empty(indptr_rows[-1], np.int32)
    dest = np.empty(len(order), np.int64)
    dest[order] = indptr_rows[:-1]
    first = 0
    for ord_offsets, ords, tf_offsets, tfs in chunks:  # each row's postings from Arrow's buffers to their place
        rows = len(ord_offsets) - 1
        _place_rows(ord_offsets, ords, tf_offsets, tfs, dest[first:first + rows], out_ords, out_tfs)
        first += rows
    sorted_terms = terms[order]
    bad = _first_unordered(indptr_rows, sorted_terms, n, out_ords)
    if bad >= 0:
        raise ValueError(f"{where}: the postings of term {int(sorted_terms[bad])} are not ascending ordinals "
                         f"below {n} (a block repeated, or an ordinal without its document)")
    firsts = np.flatnonzero(np.r_[True, sorted_terms[1:] != sorted_terms[:-1]]) if len(order) else \
        np.empty(0, np.int64)
    return SegmentShard(segment, shard, doc_ids, doc_lens, sorted_terms[firsts].astype(np.int64),
                        np.r_[indptr_rows[firsts], indptr_rows[-1]].astype(np.int64), out_ords, out_tfs)


def _list_chunks(ords_column, tfs_column, where: str) -> list[tuple[np.ndarray, ...]]:
    """(ordinal offsets [rows + 1], ordinals int32, tf offsets, tfs int32) of each chunk of two list columns, the
    values not copied (offsets index the chunk's value arrays); a table's chunks are its record batches."""
    ords_chunks = ords_column.chunks if isinstance(ords_column, pa.ChunkedArray) else [ords_column]
    tfs_chunks = tfs_column.chunks if isinstance(tfs_column, pa.ChunkedArray) else [tfs_column]
    if [len(c) for c in ords_chunks] != [len(c) for c in tfs_chunks]:
        ords_chunks, tfs_chunks = [pa.concat_arrays(ords_chunks)], [pa.concat_arrays(tfs_chunks)]
    out = []
    for ords, tfs in zip(ords_chunks, tfs_chunks):
        if ords.null_count or tfs.null_count:
            raise ValueError(f"{where}: a postings row without ordinals or tfs (null)")
        ord_offsets, tf_offsets = (c.offsets.to_numpy().astype(np.int64, copy=False) for c in (ords, tfs))
        if not np.array_equal(np.diff(ord_offsets), np.diff(tf_offsets)):
            raise ValueError(f"{where}: postings rows hold different numbers of ordinals and tfs")
        out.append((ord_offsets, ords.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False),
                    tf_offsets, tfs.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)))
    return out


@numba.njit(cache=True, nogil=True)
def _place_rows(ord_offsets, ords, tf_offsets, tfs, dest, out_ords, out_tfs):
    """Copy row i's postings to out[dest[i]:], rows read in storage order (the reads stream, the writes go to one
    place per block of rows)."""
    for i in range(len(dest)):
        o, t = dest[i], tf_offsets[i]
        for p in range(ord_offsets[i], ord_offsets[i + 1]):
            out_ords[o] = ords[p]
            out_tfs[o] = tfs[t]
            o += 1
            t += 1


@numba.njit(cache=True, nogil=True)
def _first_unordered(out_start, sorted_terms, num_docs, out_ords):
    """The first sorted row where its term's ordinals stop ascending (or leave 0..num_docs-1), or -1."""
    for i in range(len(out_start) - 1):
        lo, hi = out_start[i], out_start[i + 1]
        prev = -1
        if i > 0 and sorted_terms[i - 1] == sorted_terms[i] and out_start[i - 1] < lo:
            prev = out_ords[lo - 1]
        for p in range(lo, hi):
            if out_ords[p] <= prev or out_ords[p] >= num_docs:
                return i
            prev = out_ords[p]
    return -1


def assemble_shard(shard: int, parts: Sequence[SegmentShard], dead: Sequence[np.ndarray], dfs: DFTable,
                   stats: CorpusStats, where: str | None = None) -> ShardIndex:
    """One shard of a version from its segments' parts: the live documents (all but the ordinals in `dead`, one
    array per part) numbered in doc-id order over all parts, each term's live postings merged in that order with
    impacts under the version's `stats` and `dfs`; terms left without a live posting are
    dropped. Linear in the postings (except for sorting the live doc ids), and it writes each posting once: the
    merge computes its impact, so no tf array of the whole shard is made. `where` names the shard in errors."""
    where = where or f"shard {shard}"
    if not parts or len(parts) != len(dead):
        raise ValueError(f"{where}: {len(parts)} segments and {len(dead)} arrays of dead ordinals")
    live = []
    for part, gone in zip(parts, dead):
        alive = np.ones(part.num_docs, bool)
        alive[np.asarray(gone, np.int64)] = False
        live.append(np.flatnonzero(alive))
    if len(parts) == 1 and len(live[0]) == parts[0].num_docs:  # a full build's one segment: nothing to merge
        p = parts[0]
        return ShardIndex.from_postings(shard, p.doc_ids, p.doc_lens, p.term_ids,
                                        dfs.of_ids(p.term_ids, where), p.indptr,
                                        p.doc_ords, p.tfs, stats)
    ids = pa.concat_arrays([p.doc_ids.take(pa.array(rows)) for p, rows in zip(parts, live)])
    by_id = pc.sort_indices(ids).to_numpy() if len(parts) > 1 else np.arange(len(ids))
    rank = np.empty(len(ids), np.int32)
    rank[by_id] = np.arange(len(ids), dtype=np.int32)
    remaps, first = [], 0
    for part, rows in zip(parts, live):
        remap = np.full(part.num_docs, -1, np.int32)
        remap[rows] = rank[first:first + len(rows)]
        remaps.append(remap)
        first += len(rows)
    doc_lens = np.concatenate([p.doc_lens[rows] for p, rows in zip(parts, live)])[by_id]
    # Two sources: the part with the most postings, read in place (memory-mapped) through its ordinal map, and the
    # others' live postings copied together with their new ordinals (a version's other segments are small).
    big = int(np.argmax([len(p.doc_ords) for p in parts]))
    others = [i for i in range(len(parts)) if i != big]
    small_indptr, small_ords, small_tfs = _live_postings_of([parts[i] for i in others], [remaps[i] for i in others])
    b = parts[big]
    seq_rows, seq_terms = _rows_by_term(np.asarray(b.term_ids, np.int64), [parts[i].term_ids for i in others])
    firsts = np.flatnonzero(np.r_[True, seq_terms[1:] != seq_terms[:-1]]) if len(seq_terms) else \
        np.empty(0, np.int64)
    # Every term of the parts, DF or not: a term whose documents all left has none, and is dropped by the merge.
    union = seq_terms[firsts]
    pos = np.minimum(np.searchsorted(dfs.term_ids, union), max(len(dfs.term_ids) - 1, 0))
    found = dfs.term_ids[pos] == union if len(dfs.term_ids) else np.zeros(len(union), bool)
    term_idf = np.where(found, idf(stats.num_docs, np.where(found, dfs.dfs[pos], 1)), np.nan)
    norm = stats.k1 * (1.0 - stats.b + stats.b * doc_lens.astype(np.float64) / stats.avgdl)
    bound = len(b.doc_ords) + len(small_ords)  # the postings of the parts: the live ones are at most that many
    out = (np.empty(len(union), np.int64), np.zeros(len(union) + 1, np.int64), np.empty(len(union), IMPACT_DTYPE),
           np.empty(bound, np.int32), np.empty(bound, IMPACT_DTYPE))
    n_terms, bad = _merge_postings(seq_rows, np.r_[firsts, len(seq_rows)], union, np.asarray(b.indptr, np.int64),
                                   np.asarray(b.doc_ords, np.int32), np.asarray(b.tfs, np.int32), remaps[big],
                                   small_indptr, small_ords, small_tfs, len(b.term_ids), term_idf, norm, stats.k1 + 1.0,
                                   *out)
    if bad >= 0:
        raise ValueError(f"{where}: term {int(union[bad])} has postings but no term statistics")
    term_ids, indptr, term_max, out_ords, impacts = out
    n_postings = int(indptr[n_terms])
    return ShardIndex(shard, ids.take(pa.array(by_id)), doc_lens, term_ids[:n_terms], indptr[:n_terms + 1],
                      out_ords[:n_postings], impacts[:n_postings], term_max[:n_terms], owned=True)


def _live_postings_of(parts: Sequence[SegmentShard], remaps: Sequence[np.ndarray]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, new ordinals, tfs) of the parts' rows one after the other, each row keeping its live postings."""
    indptr, ords, tfs, base = [np.zeros(1, np.int64)], [], [], 0
    for part, remap in zip(parts, remaps):
        new = remap[np.asarray(part.doc_ords)]
        keep = new >= 0
        rows = np.repeat(np.arange(len(part.term_ids)), np.diff(np.asarray(part.indptr)))
        counts = np.bincount(rows[keep], minlength=len(part.term_ids))
        indptr.append(base + np.cumsum(counts))
        ords.append(new[keep])
        tfs.append(np.asarray(part.tfs, np.int32)[keep])
        base += int(counts.sum())
    return (np.concatenate(indptr), np.concatenate(ords) if ords else np.empty(0, np.int32),
            np.concatenate(tfs) if tfs else np.empty(0, np.int32))


def _rows_by_term(big: np.ndarray, others: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every row of the parts (numbered big's first, then the others' one after another) in term order, and its
    term: the others' rows sorted together (they are few), then merged with big's in one pass (big's row first
    where both hold a term)."""
    small = np.concatenate([np.asarray(t, np.int64) for t in others]) if others else np.empty(0, np.int64)
    order = np.argsort(small, kind="stable")
    seq_rows = np.empty(len(big) + len(small), np.int64)
    seq_terms = np.empty(len(big) + len(small), np.int64)
    _merge_rows(big, small[order], order + len(big), seq_rows, seq_terms)
    return seq_rows, seq_terms


@numba.njit(cache=True, nogil=True)
def _merge_rows(big_terms, small_terms, small_rows, seq_rows, seq_terms):
    """Merge two ascending term arrays (rows 0.. of big, small_rows of small) into seq_rows/seq_terms, big first on
    a tie."""
    i, j = 0, 0
    for x in range(len(seq_rows)):
        if j >= len(small_terms) or (i < len(big_terms) and big_terms[i] <= small_terms[j]):
            seq_rows[x], seq_terms[x] = i, big_terms[i]
            i += 1
        else:
            seq_rows[x], seq_terms[x] = small_rows[j], small_terms[j]
            j += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _row_length(r, n_big, big_indptr, small_indptr):
    """Postings of merged row r: the big part's row r, or the others' row r - n_big."""
    return big_indptr[r + 1] - big_indptr[r] if r < n_big else small_indptr[r - n_big + 1] - small_indptr[r - n_big]


@numba.njit(cache=True, nogil=True, inline="always")
def _impact(w, tf, k1_plus_1, norm_d):
    """bm25.formulas._impacts' operations in its order: the same bits as a full build's impact."""
    tf = np.float64(tf)
    return w * (tf * k1_plus_1 / (tf + norm_d))


@numba.njit(cache=True, nogil=True)
def _merge_postings(seq_rows, term_rows, union, big_indptr, big_ords, big_tfs, big_remap, small_indptr, small_ords,
                    small_tfs, n_big, term_idf, norm, k1_plus_1, out_terms, out_indptr, out_term_max, out_ords,
                    out_impacts):
    """One pass: each term's (union[t]) live postings of all its rows (seq_rows[term_rows[t]:term_rows[t + 1]];
    rows below n_big are the big part's, read through its ordinal map) merged in ordinal order with their impacts
    (the operations of bm25.formulas._impacts, so the same bits as a full build's) and each term's largest impact.
    A term's rows go shortest first into its growing list, so the longest is passed over once; a term left without
    a live posting is dropped. Returns (terms written, the index of a term with live postings but no DF (NaN idf),
    or -1). A row's copy and merge stay in this loop: as inlined helpers, their array arguments cost a reference
    count each on every row, which numba's pruning leaves (4 to 8% slower, measured)."""
    longest, most = _merge_sizes(seq_rows, term_rows, n_big, big_indptr, small_indptr)
    buf_ords = np.empty(longest, np.int32)
    buf_imps = np.empty(longest, out_impacts.dtype)
    order = np.empty(most, np.int64)
    lengths = np.empty(most, np.int64)
    o, n_terms = 0, 0
    for t in range(len(term_rows) - 1):
        lo, w = o, term_idf[t]
        k = term_rows[t + 1] - term_rows[t]
        _rows_by_length(seq_rows, term_rows[t], k, n_big, big_indptr, small_indptr, order, lengths)
        for j in range(k):
            r = order[j]
            n_have = o - lo
            for q in range(n_have):
                buf_ords[q] = out_ords[lo + q]
                buf_imps[q] = out_impacts[lo + q]
            is_big = r < n_big
            if is_big:
                p, end = big_indptr[r], big_indptr[r + 1]
            else:
                p, end = small_indptr[r - n_big], small_indptr[r - n_big + 1]
            if n_have == 0:  # the term's first row (most terms have one): a straight copy of its live postings
                x = lo
                if is_big:
                    for q in range(p, end):
                        d = big_remap[big_ords[q]]
                        if d >= 0:
                            out_ords[x] = d
                            out_impacts[x] = _impact(w, big_tfs[q], k1_plus_1, norm[d])
                            x += 1
                else:
                    for q in range(p, end):
                        d = small_ords[q]
                        out_ords[x] = d
                        out_impacts[x] = _impact(w, small_tfs[q], k1_plus_1, norm[d])
                        x += 1
                o = x
                continue
            a, x, d = 0, lo, -1
            while p < end:  # the row's next live posting: its ordinal d (p stays on it)
                d = big_remap[big_ords[p]] if is_big else small_ords[p]
                if d >= 0:
                    break
                p += 1
            while a < n_have or p < end:
                if p >= end or (a < n_have and buf_ords[a] < d):
                    out_ords[x] = buf_ords[a]
                    out_impacts[x] = buf_imps[a]
                    a += 1
                else:
                    out_ords[x] = d
                    out_impacts[x] = _impact(w, big_tfs[p] if is_big else small_tfs[p], k1_plus_1, norm[d])
                    p += 1
                    while p < end:
                        d = big_remap[big_ords[p]] if is_big else small_ords[p]
                        if d >= 0:
                            break
                        p += 1
                x += 1
            o = x
        if o > lo:
            if not _close_term(t, lo, o, w, n_terms, union, out_terms, out_indptr, out_term_max, out_impacts):
                return n_terms, t
            n_terms += 1
    return n_terms, -1


@numba.njit(cache=True, nogil=True)
def _merge_sizes(seq_rows, term_rows, n_big, big_indptr, small_indptr):
    """(the most postings of one term's rows, the most rows of one term): the sizes of the merge's buffers."""
    longest, most = 0, 0
    for t in range(len(term_rows) - 1):
        n = 0
        for i in range(term_rows[t], term_rows[t + 1]):
            n += _row_length(seq_rows[i], n_big, big_indptr, small_indptr)
        longest = max(longest, n)
        most = max(most, term_rows[t + 1] - term_rows[t])
    return longest, most


@numba.njit(cache=True, nogil=True, inline="always")
def _rows_by_length(seq_rows, first, k, n_big, big_indptr, small_indptr, order, lengths):
    """order[:k]: the rows seq_rows[first:first + k] shortest first (an insertion sort: a term has one row a part)."""
    for j in range(k):
        r = seq_rows[first + j]
        n = _row_length(r, n_big, big_indptr, small_indptr)
        q = j
        while q > 0 and lengths[q - 1] > n:
            lengths[q], order[q] = lengths[q - 1], order[q - 1]
            q -= 1
        lengths[q], order[q] = n, r


@numba.njit(cache=True, nogil=True, inline="always")
def _close_term(t, lo, o, w, n_terms, union, out_terms, out_indptr, out_term_max, out_impacts):
    """Record term t's list out[lo:o] as output term n_terms (id, largest impact, end); False if its idf w is NaN."""
    if np.isnan(w):
        return False
    top = out_impacts[lo]
    for q in range(lo + 1, o):
        top = max(top, out_impacts[q])
    out_terms[n_terms] = union[t]
    out_term_max[n_terms] = top
    out_indptr[n_terms + 1] = o
    return True


def sum_by_term(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(term ids ascending, counts) summed over `parts`, each (term ids ascending and unique, int counts): e.g. a
    version's DFs from its term-statistics versions, the first whole and the others small differences. The small
    parts are summed first, then added into the biggest by binary search: linear in the biggest."""
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    big = int(np.argmax([len(t) for t, _ in parts]))
    ids, counts = np.asarray(parts[big][0], np.int64), np.asarray(parts[big][1], np.int64)
    if len(parts) == 1:
        return ids, counts
    small_ids = np.concatenate([np.asarray(t, np.int64) for i, (t, _) in enumerate(parts) if i != big])
    small_counts = np.concatenate([np.asarray(c, np.int64) for i, (_, c) in enumerate(parts) if i != big])
    order = np.argsort(small_ids, kind="stable")
    small_ids, small_counts = small_ids[order], small_counts[order]
    if len(small_ids):
        firsts = np.flatnonzero(np.r_[True, small_ids[1:] != small_ids[:-1]])
        small_ids, small_counts = small_ids[firsts], np.add.reduceat(small_counts, firsts)
    pos = np.searchsorted(ids, small_ids)
    hit = pos < len(ids)
    hit[hit] = ids[pos[hit]] == small_ids[hit]
    counts = counts.copy()
    counts[pos[hit]] += small_counts[hit]
    return (np.insert(ids, pos[~hit], small_ids[~hit]), np.insert(counts, pos[~hit], small_counts[~hit]))
