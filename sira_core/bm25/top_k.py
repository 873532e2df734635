"""Scoring a batch of queries over the shards of one index: `top_k_shards`, and the "auto" scorer's choice.

A query's terms become one row per shard (`rows_of`), its weights fixed-point scales; a constrained query (must /
exclude terms, skipped docs) gets a doc mask per shard and is scored alone, the others share one kernel call per
scorer (sira.core.bm25.pruning, sira.core.bm25.exhaustive).

Which scorer (`scorer="auto"`): pruning pays when k is small and the lists are long, but not when they cover the
corpus many times over (nearly every document is then touched, and candidates cost more than dense accumulation).
So "auto" prunes queries with k <= PRUNE_MAX_K whose lists hold at least PRUNE_MIN_POSTINGS postings over all
shards and at most PRUNE_MAX_POSTINGS_PER_DOC per document, and scores the others exhaustively; "pruned" and
"exhaustive" force one (the tests compare them). The measurements behind the rule: docs/benchmarks.md, "When
pruning pays".

The PRUNE_* constants, and pruning's EXTEND_FRACTION, POOL_CAPACITY and MERGE_RATIO, are read at call time from
the module that defines them: set them there, not on the package.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Protocol, Sequence

import numpy as np

import sira.core.bm25.pruning as pruning
from sira.core.bm25.exhaustive import _exhaustive_top_k
from sira.core.bm25.formulas import _FIXED_SCALE, IMPACT_DTYPE, MAX_SCORE, WeightedQuery
from sira.core.bm25.pruning import _pruned_top_k

PRUNE_MAX_K = 64  # "auto" prunes queries with k up to this ...
PRUNE_MIN_POSTINGS = 65_536  # ... whose lists hold at least this many postings over all shards, ...
PRUNE_MAX_POSTINGS_PER_DOC = 4  # ... and at most this many per document; see above
_NO_IDS = np.empty(0, np.int64)  # the empty part that keeps a concatenation of no ids int64


class Shard(Protocol):
    """What scoring reads of a shard: sira.core.bm25.shard.ShardIndex, named here by its shape because that module
    imports this one (ShardIndex.top_k_many calls top_k_shards)."""

    indptr: np.ndarray
    doc_ords: np.ndarray
    impacts: np.ndarray
    term_max: np.ndarray
    tier_rows: np.ndarray
    tier_split: np.ndarray
    tier_max: np.ndarray
    max_impact: float
    _lock: threading.Lock

    @property
    def num_docs(self) -> int: ...

    def rows_of(self, term_ids: np.ndarray) -> np.ndarray: ...

    def constraint_mask(self, must: Sequence[int], exclude: Sequence[int],
                        skip: np.ndarray | None = None) -> np.ndarray | None: ...

    def _work_arrays(self) -> tuple[np.ndarray, ...]: ...


def top_k_shards(
    shards: Sequence[Shard],
    queries: Sequence[WeightedQuery],
    k: int,
    constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    skip_ords: Sequence[Sequence[np.ndarray]] | None = None,
    scorer: str = "auto",
    floors: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """ShardIndex.top_k_many over several shards of one index at once: per shard (ords [q, k] int32, scores
    [q, k] float64, hit counts [q]), which merge_top_k turns into the top k of them all. skip_ords[s][i]: the
    ordinals of shard s query i must not return. The pruned scorer handles all shards in one call, with one floor
    per query; the exhaustive one scores the shards in turn, each passing the k-th best so far on as a floor."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if scorer not in ("auto", "pruned", "exhaustive"):
        raise ValueError(f"scorer must be auto, pruned or exhaustive, got {scorer!r}")
    n_queries, n_shards = len(queries), len(shards)
    total_docs = sum(s.num_docs for s in shards)
    k = min(k, max(total_docs, 1))
    q_ptr, query_of_term, rows, weights = _batch_terms(shards, queries)
    weight_scale = weights * _FIXED_SCALE
    fixed_floors = np.zeros(n_queries, dtype=np.int64) if floors is None else \
        np.round(np.asarray(floors, dtype=np.float64) * _FIXED_SCALE).astype(np.int64)
    constrained, masks = _doc_masks(shards, n_queries, constraints, skip_ords)
    if scorer == "auto":
        prune = _auto_prunes(shards, rows, query_of_term, n_queries, k, total_docs)
    else:
        prune = np.full(n_queries, scorer == "pruned")
    out = (np.zeros((n_shards, n_queries, k), dtype=np.int32), np.zeros((n_shards, n_queries, k), dtype=np.int64),
           np.zeros((n_shards, n_queries), dtype=np.int64))  # ords, fixed-point scores, counts
    # Unconstrained queries share one compiled call per scorer; a constrained one is scored alone under its
    # doc masks.
    groups = [np.flatnonzero(~constrained & prune), np.flatnonzero(~constrained & ~prune)] + \
        [np.array([i]) for i in np.flatnonzero(constrained)]
    empty_mask = np.empty(0, np.uint8)
    with contextlib.ExitStack() as held:
        for shard in sorted(shards, key=id):  # the kernels use the shards' work arrays; one order, no deadlock
            held.enter_context(shard._lock)
        works = [s._work_arrays() for s in shards]
        for group in (g for g in groups if len(g)):
            # The group's query terms, in order: a ragged slice of the batch (numpy, not a Python loop per query).
            lengths = q_ptr[group + 1] - q_ptr[group]
            sub_ptr = np.zeros(len(group) + 1, dtype=np.int64)
            np.cumsum(lengths, out=sub_ptr[1:])
            picked = np.repeat(q_ptr[group] - sub_ptr[:-1], lengths) + np.arange(sub_ptr[-1], dtype=np.int64)
            group_masks = tuple(m if m is not None else empty_mask for m in masks[int(group[0])]) \
                if constrained[group[0]] else (empty_mask,) * n_shards
            score = _score_pruned if prune[group[0]] else _score_exhaustive
            score(shards, works, group, sub_ptr, picked, rows, weight_scale, fixed_floors[group], k, group_masks, out)
    ords, fixed, counts = out
    return [(ords[si], fixed[si] * (1.0 / _FIXED_SCALE), counts[si]) for si in range(n_shards)]


def _batch_terms(shards: Sequence[Shard], queries: Sequence[WeightedQuery]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batch's terms that some shard holds, query by query: (q_ptr: query i's are [q_ptr[i], q_ptr[i + 1]),
    the query of each, rows [shards, terms] (-1 where a shard lacks the term), weights float64). Raises when a
    query's weights could take a score past MAX_SCORE / 2."""
    n_queries = len(queries)
    term_ptr, all_ids = _ragged([q.term_ids for q in queries])
    all_weights = np.concatenate([q.weights for q in queries] + [np.empty(0, IMPACT_DTYPE)])
    rows = np.stack([s.rows_of(all_ids) for s in shards]) if len(shards) else np.empty((0, len(all_ids)), np.int64)
    keep = np.any(rows >= 0, axis=0)
    q_ptr = _kept_ptr(term_ptr, keep)
    rows, weights = np.ascontiguousarray(rows[:, keep]), all_weights[keep].astype(np.float64)
    query_of_term = np.repeat(np.arange(n_queries), np.diff(q_ptr))
    heaviest = np.bincount(query_of_term, weights=weights, minlength=n_queries)
    if np.any(heaviest * max((s.max_impact for s in shards), default=0.0) >= MAX_SCORE / 2):
        raise ValueError(f"query weights too large: scores would exceed {MAX_SCORE / 2:g}")
    return q_ptr, query_of_term, rows, weights


def _doc_masks(shards: Sequence[Shard], n_queries: int,
               constraints: Sequence[tuple[Sequence[int], Sequence[int]]] | None,
               skip_ords: Sequence[Sequence[np.ndarray]] | None) -> tuple[np.ndarray, dict[int, tuple]]:
    """Which queries are constrained (must / exclude terms, skipped docs), and the doc mask of each of those per
    shard (ShardIndex.constraint_mask; None where it allows every doc of the shard)."""
    constrained = np.zeros(n_queries, dtype=bool)
    if constraints is not None:
        constrained |= np.fromiter((bool(len(must) or len(exclude)) for must, exclude in constraints), bool,
                                   count=n_queries)
    for per_query in skip_ords or ():
        constrained |= np.fromiter((skip is not None and len(skip) > 0 for skip in per_query), bool, count=n_queries)
    masks = {int(i): tuple(
        s.constraint_mask(*(constraints[i] if constraints is not None else ((), ())),
                          None if skip_ords is None else skip_ords[si][i]) for si, s in enumerate(shards))
        for i in np.flatnonzero(constrained)}
    return constrained, masks


def _auto_prunes(shards: Sequence[Shard], rows: np.ndarray, query_of_term: np.ndarray, n_queries: int, k: int,
                 total_docs: int) -> np.ndarray:
    """Which queries "auto" prunes (module docstring): by k and the postings of their lists over all shards."""
    postings = np.zeros(n_queries)
    for s, shard_rows in zip(shards, rows):
        held = shard_rows >= 0
        postings += np.bincount(query_of_term[held], minlength=n_queries,
                                weights=s.indptr[shard_rows[held] + 1] - s.indptr[shard_rows[held]])
    return (k <= PRUNE_MAX_K) & (postings >= PRUNE_MIN_POSTINGS) & (postings <= PRUNE_MAX_POSTINGS_PER_DOC * total_docs)


def _score_pruned(shards, works, group, sub_ptr, picked, rows, weight_scale, group_floors, k, group_masks, out):
    """The queries `group` (terms `picked`, ragged by sub_ptr) by the pruned scorer, all shards in one call; their
    hits into out (ords, fixed, counts)."""
    ords, fixed, counts = out
    found = _pruned_top_k(
        *(tuple(getattr(s, name) for s in shards) for name in (
            "indptr", "doc_ords", "impacts", "term_max", "tier_rows", "tier_split", "tier_max")),
        np.array([s.num_docs for s in shards], np.int64), sub_ptr, np.ascontiguousarray(rows[:, picked]),
        weight_scale[picked], group_floors, k, group_masks, pruning.MERGE_RATIO, pruning.EXTEND_FRACTION,
        pruning.POOL_CAPACITY, *zip(*works))  # each work array, as a tuple over the shards
    for si in range(len(shards)):
        ords[si, group], fixed[si, group], counts[si, group] = found[0][si], found[1][si], found[2][si]


def _score_exhaustive(shards, works, group, sub_ptr, picked, rows, weight_scale, group_floors, k, group_masks, out):
    """The queries `group` (terms `picked`, ragged by sub_ptr) by the exhaustive scorer, shard by shard; their hits
    into out (ords, fixed, counts)."""
    ords, fixed, counts = out
    for si, s in enumerate(shards):
        acc, values, spare, touched, _, hit_ords, spare_o, _, _ = works[si]
        k_s = min(k, max(s.num_docs, 1))
        o, f, c = _exhaustive_top_k(s.indptr, s.doc_ords, s.impacts, sub_ptr, rows[si, picked], weight_scale[picked],
                                    group_floors, k_s, s.num_docs, group_masks[si], acc, values, spare, touched,
                                    hit_ords, spare_o)
        ords[si, group, :k_s], fixed[si, group, :k_s], counts[si, group] = o, f, c
        if si == len(shards) - 1:
            break  # no later shard to pass a floor on (a partition of every hit: a fifth of a k=1000 call)
        # The k-th best score so far: a later shard need not return hits below it (ties still may win on
        # doc id), which lets it skip most of its gathering.
        so_far = fixed[: si + 1, group].transpose(1, 0, 2).reshape(len(group), -1)
        full = counts[: si + 1, group].sum(axis=0) >= k
        if np.any(full):
            kth = -np.partition(-so_far, k - 1, axis=1)[:, k - 1]
            group_floors = np.where(full, np.maximum(group_floors, kth), group_floors)


def _ragged(parts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, flat) of a list of int sequences: part i is flat[ptr[i]:ptr[i + 1]]."""
    ptr = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, count=len(parts)), out=ptr[1:])
    # One concatenate of the parts as they are (int64 arrays, the usual case); a part of another type (an empty
    # list is float64 to numpy) would promote the whole batch to float, which cannot hold 64-bit ids: convert each.
    flat = np.concatenate([*parts, _NO_IDS])
    if flat.dtype != np.int64:
        flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts] + [_NO_IDS])
    return ptr, flat


def _kept_ptr(ptr: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """ptr of a ragged array (see _ragged) once the entries where `keep` is False are dropped."""
    owner = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    kept = np.zeros(len(ptr), dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=len(ptr) - 1), out=kept[1:])
    return kept
