"""The pruned scorer: exact MaxScore, term at a time, over all shards of a call at once (`top_k_shards`;
`top_k_many` for one shard).

A term with at least TIER_MIN_POSTINGS postings in a shard is stored in two tiers (`split_tiers` in
sira.core.bm25.shard, when the shard is built; caches keep them): its postings whose impact exceeds the
TIER_QUANTILE quantile of its impacts, then the others, each in ordinal order. A query's lists are its terms' tiers
in each shard; a list's bound is its weight times its largest impact (`term_max`, `tier_max`), and a shard's rest
bound is the sum of the bounds of its lists not yet added. A hit needs at least the floor: the caller's
(`floors`), raised by the k-th best partial score of the pooled docs (every allowed doc whose partial score reached
the floor; partial scores only grow, so k of them prove that the k-th best final score is at least that much).
1. Essential phase: lists by bound per posting, highest first (rare terms and high tiers: they lift the floor
   and lower the rest bound most per posting read). A list is added in full, its new docs remembered as touched,
   while its shard's rest bound (the list included) reaches the floor: a doc none of the lists left holds could
   still reach it. Below the floor no new doc of that shard can; a list then still adds to the touched docs
   while the rest bound is at least EXTEND_FRACTION of the floor (fewer candidates: a candidate costs more than
   a posting), and the others are deferred.
2. Candidate phase, shard by shard: the touched docs whose partial score plus the deferred bounds can reach the
   floor; each deferred list, largest bound first, adds to them (a galloping merge in ordinal order when they
   are few for its list, else a scan), and the candidates the lists left cannot lift to the floor are dropped.
   Each shard's hits (exact scores) raise the floor for the shards after it.
Must / exclude terms and skipped documents are a doc mask, an exact filter applied before any document counts
towards the floor. The per-doc steps (is a doc new, is it a candidate, does it stay one) are branch-free: their
outcomes are coin tosses, and mispredicted branches had cost more than the work. The accumulator is touched at
random, so the essential phase asks for the cache line of the posting PREFETCH_DISTANCE ahead. What each step
brought on 1M documents is in docs/benchmarks.md.

EXTEND_FRACTION, POOL_CAPACITY and MERGE_RATIO are read at call time (top_k_shards passes them to the kernel): set
them on this module, not on the package. PREFETCH_DISTANCE is a compile-time constant of the kernels.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from sira.core.bm25.formulas import _fixed
from sira.core.bm25.selection import _kth_largest, _offer, _write_best

EXTEND_FRACTION = 0.8  # after the switch, lists go on adding to touched docs while the rest bound >= this x floor
POOL_CAPACITY = 1024  # docs at or above the floor the pruned scorer keeps to raise it
PREFETCH_DISTANCE = 16  # postings ahead whose accumulator line the essential phase asks for
MERGE_RATIO = 8  # a deferred list is merged into the candidates (galloping) when it is this many times longer


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the CPU for the cache line of array[index] (llvm.prefetch for writing): the accumulator of a pruned
    query is touched at random, and asking PREFETCH_DISTANCE postings ahead overlaps those misses."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, array_type, ary, [args[1]], wraparound=False,
                                       boundscheck=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(array, index), codegen


@numba.njit(cache=True, nogil=True)
def _gallop(values, lo, hi, target):
    """First position in [lo, hi) whose value is >= target (values sorted): exponential then binary search,
    so a cursor that moves forward a little pays a little."""
    if lo >= hi or values[lo] >= target:
        return lo
    below = lo  # values[below] < target
    step = 1
    probe = lo + 1
    while probe < hi and values[probe] < target:
        below = probe
        step <<= 1
        probe = below + step
    top = min(probe, hi)
    lo = below + 1
    while lo < top:
        mid = (lo + top) >> 1
        if values[mid] < target:
            lo = mid + 1
        else:
            top = mid
    return lo


# de Bruijn sequence for the index of the lowest set bit of a uint64 (numba has no count-trailing-zeros).
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_INDEX = np.array([0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43,
                            22, 45, 39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44,
                            32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _in_ordinal_order(docs, n, marks, w_lo, w_hi, out):
    """docs[:n] (distinct ordinals, all in words [w_lo, w_hi) of the bitmap) sorted into out, through the
    bitmap: O(n + (w_hi - w_lo)), far cheaper than a sort."""
    for i in range(n):
        d = docs[i]
        marks[d >> 6] |= np.uint64(1) << np.uint64(d & 63)
    m = 0
    for wi in range(w_lo, w_hi):
        word = marks[wi]
        if word == 0:
            continue
        marks[wi] = 0
        while word != 0:
            low = word & (~word + np.uint64(1))
            out[m] = wi * 64 + _DEBRUIJN_INDEX[(low * _DEBRUIJN) >> np.uint64(58)]
            m += 1
            word ^= low
    return m


@numba.njit(cache=True, nogil=True, inline="always")
def _keep_reaching(acc, cand, nc, need):
    """Keep the candidates whose partial score reaches `need`, in order, branch-free; returns how many."""
    kept = 0
    for c in range(nc):
        d = cand[c]
        cand[kept] = d
        kept += acc[d] >= need
    return kept


@numba.njit(cache=True, nogil=True)
def _pool_kth(accs, pool_s, pool_d, n_pool, k, heap):
    """The k-th largest current partial score of the pooled docs (n_pool >= k; a min-heap, as _kth_largest)."""
    for i in range(k):
        heap[i] = accs[pool_s[i]][pool_d[i]]
    heap[:k].sort()
    for i in range(k, n_pool):
        _offer(heap, k, accs[pool_s[i]][pool_d[i]])
    return heap[0]


@numba.njit(cache=True, nogil=True)
def _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, most):
    """Keep the pooled docs whose partial score reaches the floor, at most `most` of them (ties at the floor may
    be more; any k of the pooled docs give a floor); the others may come back later."""
    kept = 0
    for p in range(n_pool):
        s, d = pool_s[p], pool_d[p]
        if accs[s][d] >= floor and kept < most:
            pool_s[kept] = s
            pool_d[kept] = d
            kept += 1
        else:
            pooled_t[s][d >> 6] &= ~(np.uint64(1) << np.uint64(d & 63))
    return kept


@numba.njit(cache=True, nogil=True)
def _pruned_top_k(indptrs, doc_ords_t, impacts_t, term_max_t, tier_rows_t, tier_split_t, tier_max_t, n_docs_t,
                  q_ptr, rows, weight_scale, floors, k, masks, merge_ratio, extend_fraction, pool_capacity, accs,
                  values_t, spares, toucheds, cands, hit_ords_t, spare_os, marks_t, pooled_t):
    """MaxScore over all shards at once (module docstring). rows[s, i]: the row of term i in shard s
    (-1: none). Returns per shard (ords [S, q, k] int32, fixed scores [S, q, k] int64, counts [S, q]), each row
    best first, for merge_top_k."""
    n_shards = len(indptrs)
    n_queries = q_ptr.size - 1
    out_ords = np.zeros((n_shards, n_queries, k), dtype=np.int32)
    out_fixed = np.zeros((n_shards, n_queries, k), dtype=np.int64)
    counts = np.zeros((n_shards, n_queries), dtype=np.int64)
    width = 1
    for q in range(n_queries):
        width = max(width, 2 * n_shards * (q_ptr[q + 1] - q_ptr[q]))
    # A query's lists (_query_lists): shard, postings [lo, hi), weight, bound, sort key, deferred.
    lists = (np.empty(width, np.int64), np.empty(width, np.int64), np.empty(width, np.int64),
             np.empty(width, np.float64), np.empty(width, np.int64), np.empty(width, np.float64),
             np.zeros(width, np.bool_))
    deferred = np.empty(width, np.int64)
    pre = np.empty(width + 1, np.int64)
    rest = np.zeros(n_shards, np.int64)  # per shard: the bounds of its lists not yet added
    n_touched = np.zeros(n_shards, np.int64)
    capacity = max(pool_capacity, 2 * k)
    pool_s = np.empty(capacity, np.int64)
    pool_d = np.empty(capacity, np.int32)
    heap = np.empty(k, np.int64)
    best = np.empty(n_shards * k, np.int64)
    for q in range(n_queries):
        n = _query_lists(q_ptr[q], q_ptr[q + 1], rows, weight_scale, indptrs, term_max_t, tier_rows_t, tier_split_t,
                         tier_max_t, lists, rest)
        order = np.argsort(lists[5][:n])
        floor = _essential_phase(lists, order, n, rest, max(floors[q], np.int64(1)), k, extend_fraction, accs,
                                 doc_ords_t, impacts_t, masks, toucheds, n_touched, pooled_t, pool_s, pool_d, heap)
        n_best = 0
        for s in range(n_shards):
            got, floor = _candidate_phase(s, lists, order, n, floor, k, merge_ratio, n_docs_t[s], accs[s],
                                          doc_ords_t[s], impacts_t[s], masks[s], toucheds[s], n_touched[s], cands[s],
                                          marks_t[s], deferred, pre, values_t[s], hit_ords_t[s], spares[s],
                                          spare_os[s], out_fixed[s, q], out_ords[s, q])
            counts[s, q] = got
            # The hits so far are exact scores: the k-th best of them is a floor for the shards after.
            best[n_best : n_best + got] = out_fixed[s, q, :got]
            n_best += got
            if n_best >= k:
                floor = max(floor, np.partition(best[:n_best], n_best - k)[n_best - k])
    return out_ords, out_fixed, counts


@numba.njit(cache=True, nogil=True)
def _query_lists(q_lo, q_hi, rows, weight_scale, indptrs, term_max_t, tier_rows_t, tier_split_t, tier_max_t, lists,
                 rest):
    """The lists of the query of terms q_lo..q_hi - 1 into `lists`: per shard, one per term it holds, or two for a
    term stored in tiers, each with its bound (weight x its largest impact) and its sort key (minus its bound per
    posting: ascending is best first), not deferred. rest[s]: the bounds of shard s's lists. Returns how many."""
    l_shard, l_lo, l_hi, l_w, l_bound, l_key, l_deferred = lists
    n = 0
    rest[:] = 0
    for s in range(len(indptrs)):
        indptr, tier_rows = indptrs[s], tier_rows_t[s]
        for i in range(q_lo, q_hi):
            r = rows[s, i]
            if r < 0:
                continue
            w = weight_scale[i]
            lo, hi = indptr[r], indptr[r + 1]
            t = np.searchsorted(tier_rows, r)
            mid = tier_split_t[s][t] if t < tier_rows.size and tier_rows[t] == r else hi
            for part in range(2):
                a, b = (lo, mid) if part == 0 else (mid, hi)
                if b <= a:
                    continue
                top = term_max_t[s][r] if part == 0 else tier_max_t[s][t]
                l_shard[n], l_lo[n], l_hi[n], l_w[n] = s, a, b, w
                l_bound[n] = _fixed(top, w)
                l_key[n] = -np.float64(l_bound[n]) / (b - a)
                l_deferred[n] = False
                rest[s] += l_bound[n]
                n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _essential_phase(lists, order, n, rest, floor, k, extend_fraction, accs, doc_ords_t, impacts_t, masks, toucheds,
                     n_touched, pooled_t, pool_s, pool_d, heap):
    """The essential phase of one query (module docstring): its lists in `order`, each added in full while its
    shard's rest bound (the list included) reaches the floor; below it, added to the docs already touched while the
    rest bound is still >= extend_fraction x floor (fewer candidates), else marked deferred. toucheds[s][:n_touched[s]]:
    the docs of shard s it touched. Returns the floor, raised by the k-th best partial score of the pooled docs
    (pool_s / pool_d, marked in pooled_t: every allowed doc whose partial score reached the floor); leaves the pool
    empty."""
    l_shard, l_lo, l_hi, l_w, l_bound, _, l_deferred = lists
    capacity = pool_s.size
    n_pool = 0
    n_touched[:] = 0
    for x in range(n):
        li = order[x]
        s = l_shard[li]
        acc, doc_ords, impacts = accs[s], doc_ords_t[s], impacts_t[s]
        w, lo, hi = l_w[li], l_lo[li], l_hi[li]
        if rest[s] < floor:
            if np.float64(rest[s]) < extend_fraction * np.float64(floor):
                l_deferred[li] = True
                continue
            for j in range(lo, hi):
                if j + PREFETCH_DISTANCE < hi:
                    _prefetch(acc, doc_ords[j + PREFETCH_DISTANCE])
                d = doc_ords[j]
                acc[d] += _fixed(impacts[j], w) * (acc[d] != 0)
            rest[s] -= l_bound[li]
            continue
        touched, pooled, mask = toucheds[s], pooled_t[s], masks[s]
        filtered = mask.size > 0
        m = n_touched[s]
        for j in range(lo, hi):
            if j + PREFETCH_DISTANCE < hi:
                _prefetch(acc, doc_ords[j + PREFETCH_DISTANCE])
            d = doc_ords[j]
            touched[m] = d  # branch-free: whether a doc is new is a coin toss (touched holds n_docs + 1)
            v = acc[d]
            m += v == 0
            v += _fixed(impacts[j], w)
            acc[d] = v
            if v >= floor and (not filtered or mask[d] != 0):
                bit = np.uint64(1) << np.uint64(d & 63)
                if pooled[d >> 6] & bit == 0:
                    pooled[d >> 6] |= bit
                    pool_s[n_pool] = s
                    pool_d[n_pool] = d
                    n_pool += 1
                    if n_pool == capacity:
                        floor = max(floor, _pool_kth(accs, pool_s, pool_d, n_pool, k, heap))
                        n_pool = _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, capacity // 2)
        n_touched[s] = m
        rest[s] -= l_bound[li]
        if n_pool >= k:
            floor = max(floor, _pool_kth(accs, pool_s, pool_d, n_pool, k, heap))
            n_pool = _pool_keep(accs, pooled_t, pool_s, pool_d, n_pool, floor, capacity // 2)
    for p in range(n_pool):
        pooled_t[pool_s[p]][pool_d[p] >> 6] = 0
    return floor


@numba.njit(cache=True, nogil=True)
def _candidate_phase(s, lists, order, n, floor, k, merge_ratio, n_docs, acc, doc_ords, impacts, mask, touched,
                     n_touched, cand, marks, deferred, pre, values, hit_ords, spare, spare_o, out_fixed, out_ords):
    """The candidate phase of one query in shard s (module docstring): the touched docs whose partial score plus
    the deferred bounds can reach the floor; each deferred list, largest bound first, adds to them, and the
    candidates the lists left cannot lift to the floor are dropped. Writes the hits (exact scores) best first to
    out_fixed / out_ords and zeroes acc again. Returns (hits written, floor)."""
    l_lo, l_hi, l_w = lists[1], lists[2], lists[3]
    filtered = mask.size > 0
    nd = _deferred_by_bound(s, lists, order, n, deferred, pre)
    need = floor - pre[nd]
    nc = 0
    for t in range(n_touched):
        d = touched[t]
        cand[nc] = d
        nc += (acc[d] >= need) & (not filtered or mask[d] != 0)
    # Partial scores only grow: the k-th best of them is a floor too.
    if nc > k:
        raised = _kth_largest(acc, cand, nc, k, spare)
        if raised > floor:
            floor = raised
            nc = _keep_reaching(acc, cand, nc, floor - pre[nd])
    if nd > 0 and nc > 0:
        nc = _in_ordinal_order(cand, nc, marks, 0, ((n_docs - 1) >> 6) + 1, cand)
    for e in range(nd - 1, -1, -1):
        if nc == 0:
            break
        li = deferred[e]
        _add_to_candidates(acc, doc_ords, impacts, l_w[li], l_lo[li], l_hi[li], cand, nc, merge_ratio)
        nc = _keep_reaching(acc, cand, nc, floor - pre[e])
    m = 0
    for c in range(nc):
        d = cand[c]
        if acc[d] >= floor:
            values[m] = acc[d]
            hit_ords[m] = d
            m += 1
    for t in range(n_touched):
        acc[touched[t]] = 0
    return _write_best(values, hit_ords, m, k, spare, spare_o, out_fixed, out_ords), floor


@numba.njit(cache=True, nogil=True)
def _deferred_by_bound(s, lists, order, n, deferred, pre):
    """Shard s's deferred lists into `deferred` by bound ascending (an insertion sort: they are few), and into
    pre[e] the sum of the bounds of the first e. Returns how many."""
    l_shard, l_bound, l_deferred = lists[0], lists[4], lists[6]
    nd = 0
    for x in range(n):
        li = order[x]
        if l_shard[li] == s and l_deferred[li]:
            j = nd
            while j > 0 and l_bound[deferred[j - 1]] > l_bound[li]:
                deferred[j] = deferred[j - 1]
                j -= 1
            deferred[j] = li
            nd += 1
    pre[0] = 0
    for e in range(nd):
        pre[e + 1] = pre[e] + l_bound[deferred[e]]
    return nd


@numba.njit(cache=True, nogil=True)
def _add_to_candidates(acc, doc_ords, impacts, w, lo, hi, cand, nc, merge_ratio):
    """Add the list [lo, hi) (weight w) to the candidates cand[:nc] (in ordinal order): a galloping merge when the
    list is more than merge_ratio times longer, else a scan where only touched docs take contributions."""
    if hi - lo > merge_ratio * nc:
        p = lo
        for c in range(nc):
            d = cand[c]
            p = _gallop(doc_ords, p, hi, d)
            if p >= hi:
                break
            if doc_ords[p] == d:
                acc[d] += _fixed(impacts[p], w)
                p += 1
    else:
        for j in range(lo, hi):
            d = doc_ords[j]
            acc[d] += _fixed(impacts[j], w) * (acc[d] != 0)
