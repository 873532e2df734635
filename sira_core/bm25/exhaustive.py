"""The exhaustive scorer: every posting of a query's terms added into a dense accumulator, then the hits gathered.

Few postings (under a quarter of the docs): the docs touched are remembered, so accumulating, gathering and
resetting cost O(postings). Many: one scan of the accumulator in ordinal order gathers the hits above a threshold
that rises as it goes. Below HISTOGRAM_K the hits go into a heap of the k best (the threshold is its root from
the k-th hit on); from HISTOGRAM_K into a buffer cut to the k best whenever it fills. For k >= HISTOGRAM_K the scan first
guesses the threshold from every SAMPLE_STRIDE-th doc, and keeps the result when at least k hits pass it (so none
of the k best is lost): at k = 1000 the gathering costs more than the scoring. top_k_shards scores the shards in
turn, each passing the k-th best so far on as the next one's floor.

SAMPLE_STRIDE and HISTOGRAM_K are compile-time constants of the kernels (numba freezes globals when it compiles).
"""

from __future__ import annotations

import numba
import numpy as np

import sira.core.bm25.selection as selection
from sira.core.bm25.formulas import _fixed
from sira.core.bm25.selection import _keep_best, _kth_largest, _offer_hit, _write_best

SAMPLE_STRIDE = 16  # the exhaustive scorer guesses its threshold from every SAMPLE_STRIDE-th doc (k >= HISTOGRAM_K)


@numba.njit(cache=True, nogil=True)
def _gather_from_sample(acc, n_docs, k, theta, filtered, allowed, values, hit_ords):
    """Hits of acc[:n_docs] above a guessed threshold into values / hit_ords, acc untouched: the threshold is
    the score about 2k / SAMPLE_STRIDE of every SAMPLE_STRIDE-th doc beat, so about 2k docs pass. Returns how
    many passed (0 when the sample is too thin to guess)."""
    rank = 2 * k // SAMPLE_STRIDE
    ns = 0
    for d in range(0, n_docs, SAMPLE_STRIDE):
        if acc[d] > theta and (not filtered or allowed[d] != 0):
            hit_ords[ns] = d
            ns += 1
    if rank < 1 or ns < rank:
        return 0
    guess = max(_kth_largest(acc, hit_ords, ns, rank, values) - 1, theta)
    m = 0
    for d in range(n_docs):
        s = acc[d]
        if s > guess and (not filtered or allowed[d] != 0):
            values[m] = s
            hit_ords[m] = d
            m += 1
    return m


@numba.njit(cache=True, nogil=True)
def _gather_in_order(acc, n_docs, k, theta, filtered, allowed, values, hit_ords, spare, spare_o):
    """The hits of acc[:n_docs] above theta, in one scan in ordinal order, where a hit equal to the k-th best never
    beats it; acc left zeroed. Returns m: below HISTOGRAM_K, values / hit_ords[:m] is a heap of the k best; from
    it, a buffer cut to the k best whenever it fills (cap), so the k best are among its m. (The gathering is
    inline: a helper call per hit costs 3x as much.)"""
    m = 0
    if k < selection.HISTOGRAM_K:
        for d in range(n_docs):
            s = acc[d]
            if s > theta and (not filtered or allowed[d] != 0):
                m = _offer_hit(values, hit_ords, m, k, s, d)
                if m == k:
                    theta = values[0]
        acc[:n_docs] = 0
        return m
    cap = min(8 * k + 64, n_docs)  # hits gathered before only the k best are kept
    for d in range(n_docs):
        s = acc[d]
        acc[d] = 0
        if s > theta and (not filtered or allowed[d] != 0):
            values[m] = s
            hit_ords[m] = d
            m += 1
            if m == cap:
                m = _keep_best(values, hit_ords, m, k, spare, spare_o)
                theta = values[:m].min()
    return m


@numba.njit(cache=True, nogil=True)
def _exhaustive_top_k(indptr, doc_ords, impacts, q_ptr, rows, weight_scale, floors, k, n_docs, allowed, acc,
                      values, spare, touched, hit_ords, spare_o):
    """Each query of a batch on one shard: (ords [q, k] int32, fixed scores [q, k] int64, hit counts [q]), each row
    best first. rows[i]: the row of term i (-1: none); floors[q]: query q needs no hit scoring below it; allowed:
    a 0/1 doc mask (empty: none). acc (zeroed, left zeroed) and the other arrays: the shard's work arrays."""
    n_queries = q_ptr.size - 1
    filtered = allowed.size > 0  # a 0/1 mask over doc ordinals (constraints); empty: every doc may rank
    out_ords = np.zeros((n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_queries, k), dtype=np.int64)
    counts = np.zeros(n_queries, dtype=np.int64)
    for q in range(n_queries):
        n_postings = 0
        for i in range(q_ptr[q], q_ptr[q + 1]):
            if rows[i] >= 0:  # -1: a term this shard lacks (another shard of the call holds it)
                n_postings += indptr[rows[i] + 1] - indptr[rows[i]]
        m = 0
        if n_postings * 4 < n_docs:
            # Few postings: remember touched docs so accumulation, selection and reset cost O(postings).
            # Every contribution is >= 1, so a zero sum means "not touched yet".
            n_touched = 0
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                if r < 0:
                    continue
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    d = doc_ords[j]
                    if acc[d] == 0:
                        touched[n_touched] = d
                        n_touched += 1
                    acc[d] += _fixed(impacts[j], w)
            small_k = k < selection.HISTOGRAM_K
            for t in range(n_touched):
                d = touched[t]
                s = acc[d]
                acc[d] = 0
                if s >= floors[q] and (not filtered or allowed[d] != 0):
                    if small_k:
                        m = _offer_hit(values, hit_ords, m, k, s, d)
                    else:
                        values[m] = s
                        hit_ords[m] = d
                        m += 1
        else:
            # Many postings: accumulate, then one scan in ordinal order (_gather_in_order).
            for i in range(q_ptr[q], q_ptr[q + 1]):
                r = rows[i]
                if r < 0:
                    continue
                w = weight_scale[i]
                for j in range(indptr[r], indptr[r + 1]):
                    acc[doc_ords[j]] += _fixed(impacts[j], w)
            theta = max(floors[q] - 1, np.int64(0))  # a hit needs more than theta
            if k >= selection.HISTOGRAM_K:
                # A large k gathers many hits before theta rises. Guess a theta that about 2k hits pass from
                # every SAMPLE_STRIDE-th doc, gather at it without resetting acc, and keep the result if at
                # least k passed (then the k best all did); else gather again from the true theta.
                m = _gather_from_sample(acc, n_docs, k, theta, filtered, allowed, values, hit_ords)
                if m >= k:
                    acc[:] = 0
                    counts[q] = _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed[q], out_ords[q])
                    continue
            m = _gather_in_order(acc, n_docs, k, theta, filtered, allowed, values, hit_ords, spare, spare_o)
        counts[q] = _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed[q], out_ords[q])
    return out_ords, out_fixed, counts
