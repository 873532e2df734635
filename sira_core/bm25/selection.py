"""Selecting the k best hits by (score desc, doc ordinal asc): the kernels both scorers finish with.

A scorer gathers hits (score, ordinal) into a buffer in any order; `_keep_best` cuts them to the k best and
`_write_best` writes those best first. For k >= HISTOGRAM_K the cut first drops the hits below the histogram
bucket of the k-th best score, then partially sorts the rest: at k = 1000 the gathering costs more than the
scoring. `_kth_largest` finds the k-th best of some scores through a min-heap (`_offer`). Below HISTOGRAM_K the
exhaustive scorer keeps the k best hits in a heap as it goes instead (`_offer_hit`): a cut costs a partition and
its copy, so cutting a buffer every few hundred hits cost as much as the scoring at k = 10.

HISTOGRAM_K is a compile-time constant of the kernels (numba freezes globals when it compiles).
"""

from __future__ import annotations

import numba
import numpy as np

HISTOGRAM_K = 128  # from this k, selection cuts by a histogram (and the exhaustive scorer guesses its threshold)


@numba.njit(cache=True, nogil=True)
def _drop_below_histogram_bucket(buf_s, buf_o, m, k):
    """Drop from buf[:m] the hits below the histogram bucket that holds the k-th best score, keeping at least k
    (and every hit that ties with or beats the k-th best): two passes over buf, where np.partition (what
    _keep_best finishes with) costs several times as much per value. Returns how many are kept."""
    lo = buf_s[0]
    hi = buf_s[0]
    for i in range(1, m):
        lo = min(lo, buf_s[i])
        hi = max(hi, buf_s[i])
    if lo == hi:
        return m
    n_buckets = 1024
    scale = (n_buckets - 1) / np.float64(hi - lo)  # a monotone bucket of each score: equal scores share one
    hist = np.zeros(n_buckets, dtype=np.int64)
    for i in range(m):
        hist[np.int64((buf_s[i] - lo) * scale)] += 1
    above = 0
    b = n_buckets - 1
    while b > 0:
        above += hist[b]
        if above >= k:
            break
        b -= 1
    kept = 0
    for i in range(m):
        if np.int64((buf_s[i] - lo) * scale) >= b:
            buf_s[kept] = buf_s[i]
            buf_o[kept] = buf_o[i]
            kept += 1
    return kept


@numba.njit(cache=True, nogil=True)
def _keep_best(buf_s, buf_o, m, k, scratch_s, scratch_o):
    """Keep the k best of the m hits in buf[:m] (score desc, ordinal asc; given in any order) in buf[:k].
    Returns how many are kept; when that is k, buf_s[:k].min() is the k-th best score."""
    if m <= k:
        return m
    if k >= HISTOGRAM_K and m > 2 * k:
        m = _drop_below_histogram_bucket(buf_s, buf_o, m, k)
        if m <= k:
            return m
    scratch_s[:m] = buf_s[:m]
    kth = np.partition(scratch_s[:m], m - k)[m - k]
    above = 0
    ties = 0
    for i in range(m):
        if buf_s[i] > kth:
            above += 1
        elif buf_s[i] == kth:
            scratch_o[ties] = buf_o[i]
            ties += 1
    need = k - above  # of the hits tied at kth, the `need` lowest ordinals stay
    last_ord = np.partition(scratch_o[:ties], need - 1)[need - 1] if need < ties else np.int32(2**31 - 1)
    kept = 0
    for i in range(m):
        if buf_s[i] > kth or (buf_s[i] == kth and buf_o[i] <= last_ord):
            buf_s[kept] = buf_s[i]
            buf_o[kept] = buf_o[i]
            kept += 1
    return kept


@numba.njit(cache=True, nogil=True)
def _write_best(buf_s, buf_o, m, k, scratch_s, scratch_o, out_s, out_o):
    """The k best of buf[:m] into out, best first; returns how many."""
    n = _keep_best(buf_s, buf_o, m, k, scratch_s, scratch_o)
    by_score = np.argsort(-buf_s[:n])
    for i in range(n):
        out_s[i] = buf_s[by_score[i]]
        out_o[i] = buf_o[by_score[i]]
    # Equal scores come out of the sort in any order: each run of them is put in ordinal order, by an insertion
    # sort over the whole output (a sort call per run costs more than the sort by score).
    for i in range(1, n):
        o = out_o[i]
        j = i
        while j > 0 and out_s[j - 1] == out_s[i] and out_o[j - 1] > o:
            out_o[j] = out_o[j - 1]
            j -= 1
        out_o[j] = o
    return n


@numba.njit(cache=True, nogil=True)
def _kth_largest(acc, docs, n, k, heap):
    """The k-th largest of acc[docs[:n]] (n >= k), through a min-heap of k values: most values lose to its root
    at one comparison, so this costs about n comparisons for a small k (np.partition copies and shuffles)."""
    for i in range(k):
        heap[i] = acc[docs[i]]
    heap[:k].sort()  # a sorted array is a min-heap
    for i in range(k, n):
        _offer(heap, k, acc[docs[i]])
    return heap[0]


@numba.njit(cache=True, nogil=True, inline="always")
def _offer(heap, k, v):
    """Put v into the min-heap heap[:k] when it beats the root: replace the root, sift down."""
    if v <= heap[0]:
        return
    j = 0
    while True:
        c = 2 * j + 1
        if c >= k:
            break
        if c + 1 < k and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[j] = heap[c]
        j = c
    heap[j] = v


@numba.njit(cache=True, nogil=True, inline="always")
def _worse(s_a, o_a, s_b, o_b):
    """Hit a ranks below hit b: a lower score, or an equal one at a higher ordinal."""
    return s_a < s_b or (s_a == s_b and o_a > o_b)


@numba.njit(cache=True, nogil=True, inline="always")
def _offer_hit(heap_s, heap_o, n, k, s, d):
    """Offer hit (score s, ordinal d) to heap_s / heap_o[:n], the k best hits so far, rooted at the worst of them.
    Hits may come in any order. Returns the new size; once it is k, heap_s[0] is the k-th best score."""
    if n < k:
        j = n
        while j > 0:  # sift the new hit up past every parent that ranks above it (the worst is the root)
            p = (j - 1) >> 1
            if not _worse(s, d, heap_s[p], heap_o[p]):
                break
            heap_s[j], heap_o[j] = heap_s[p], heap_o[p]
            j = p
        heap_s[j], heap_o[j] = s, d
        return n + 1
    if not _worse(heap_s[0], heap_o[0], s, d):
        return n  # no better than the k-th best
    j = 0
    while 2 * j + 1 < k:  # replace the root, sift down past every child that ranks below it
        c = 2 * j + 1
        if c + 1 < k and _worse(heap_s[c + 1], heap_o[c + 1], heap_s[c], heap_o[c]):
            c += 1
        if not _worse(heap_s[c], heap_o[c], s, d):
            break
        heap_s[j], heap_o[j] = heap_s[c], heap_o[c]
        j = c
    heap_s[j], heap_o[j] = s, d
    return n
