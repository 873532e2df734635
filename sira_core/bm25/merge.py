"""Merging the per-shard top-k of a query batch into the top-k of the whole index.

Top-k uses a total order, (score desc, doc ordinal asc). Doc ordinals follow doc-id order inside a shard, so
merging per-shard top-k by (score desc, doc id asc) equals the single-shard result exactly.
"""

from __future__ import annotations

from typing import Sequence

import numba
import numpy as np


def merge_top_k(scores: Sequence[np.ndarray], ords: Sequence[np.ndarray], counts: Sequence[np.ndarray],
                doc_ids: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, ...]:
    """Merge per-shard top-k of a query batch into the global top-k, by (score desc, doc id asc): what one
    shard holding every document would return. Shard s gives scores[s] [q, >= counts] (float64), ords[s]
    (int32, same shape) and counts[s] [q], each row sorted by (score desc, ordinal asc), and its doc ids as
    (offsets, UTF-8 bytes) (ShardIndex.doc_id_offsets / doc_id_data): ordinal order is doc-id order inside
    a shard, so doc ids are compared only for equal scores from different shards (bytewise, as UTF-8 orders
    code points). Returns (shard [q, k] int64, ords [q, k] int32, scores [q, k] float64, hit counts [q])."""
    return _merge_top_k(tuple(scores), tuple(ords), tuple(counts), tuple(o for o, _ in doc_ids),
                        tuple(d for _, d in doc_ids), k)


@numba.njit(cache=True, nogil=True, inline="always")
def _id_less(off_a, data_a, i, off_b, data_b, j):
    """Is doc id i of shard a before doc id j of shard b (bytewise)?"""
    a0, a1, b0, b1 = off_a[i], off_a[i + 1], off_b[j], off_b[j + 1]
    for t in range(min(a1 - a0, b1 - b0)):
        if data_a[a0 + t] != data_b[b0 + t]:
            return data_a[a0 + t] < data_b[b0 + t]
    return a1 - a0 < b1 - b0


@numba.njit(cache=True, nogil=True)
def _merge_top_k(scores, ords, counts, id_offsets, id_data, k):
    n_shards = len(scores)
    n_queries = counts[0].size
    out_shard = np.zeros((n_queries, k), dtype=np.int64)
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_scores = np.zeros((n_queries, k), dtype=np.float64)
    out_counts = np.zeros(n_queries, dtype=np.int64)
    head = np.zeros(n_shards, dtype=np.int64)
    for q in range(n_queries):
        head[:] = 0
        n = 0
        while n < k:
            best = -1
            best_score = 0.0
            best_ord = 0
            for s in range(n_shards):
                h = head[s]
                if h >= counts[s][q]:
                    continue
                score = scores[s][q, h]
                ord_ = ords[s][q, h]
                if best < 0 or score > best_score or (score == best_score and _id_less(
                        id_offsets[s], id_data[s], ord_, id_offsets[best], id_data[best], best_ord)):
                    best, best_score, best_ord = s, score, ord_
            if best < 0:
                break
            out_shard[q, n] = best
            out_ords[q, n] = best_ord
            out_scores[q, n] = best_score
            head[best] += 1
            n += 1
        out_counts[q] = n
    return out_shard, out_ords, out_scores, out_counts
