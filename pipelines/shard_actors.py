"""Shards held by Ray actors and queried scatter-gather: each actor scores a batch of compiled queries on
its shard (memory-mapped from the local shard cache, so actors of one machine share its pages); ShardActors
sends the batch to every actor and merges their per-shard top-k columns (sira.core.search.merge_ranked), so it
ranks exactly like the in-process Searcher. Both are the Scorer of sira.core.query_path."""

from __future__ import annotations

from typing import Iterable, Sequence

import pyarrow as pa
import ray

from sira.pipelines.shard_cache import cached_shard
from sira.pipelines.shard_loader import load_shard
from sira.core.bm25 import WeightedQuery
from sira.core.hashing import term_id
from sira.core.query_path import Constraint, Ranked
from sira.core.search import merge_ranked


@ray.remote(num_cpus=0.25)  # fractional: on small machines whole-CPU actors starve everything else
class ShardActor:
    def __init__(self, warehouse: str, manifest: dict, shard: int):
        # A version not cached yet is served from memory as soon as it is assembled, and from the shared
        # memory-mapped cache once written (the same arrays: a search may use either).
        self.shard = cached_shard(warehouse, manifest, shard, load_shard, write_behind=self._mapped)
        warm_up(self.shard)

    def _mapped(self, shard) -> None:
        self.shard = shard

    def num_docs(self) -> int:
        return self.shard.num_docs

    def top_k(self, queries: Sequence[WeightedQuery], k: int, constraints: Sequence[Constraint] | None = None,
              exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> list[Ranked]:
        """[(doc ids (Arrow), scores (float64))] per query, best first, on this shard alone."""
        ids = [([term_id(t) for t in must], [term_id(t) for t in exclude]) for must, exclude in constraints or ()]
        skip = [self.shard.ords_of(e) for e in exclude_doc_ids] if exclude_doc_ids is not None else None
        ords, scores, counts = self.shard.top_k_many(queries, k, ids or None, skip)
        return [(self.shard.doc_ids.take(pa.array(ords[i, : counts[i]])), scores[i, : counts[i]])
                for i in range(len(queries))]

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per-term contributions (ShardIndex.contributions) of those of `doc_ids` this shard holds."""
        return {self.shard.doc_ids[int(o)].as_py(): self.shard.contributions(int(o), query)
                for o in self.shard.ords_of(doc_ids)}


def warm_up(shard) -> None:
    """Score a query of the shard's longest posting lists with each scorer, so that its kernels are compiled (or
    loaded from numba's cache) before the actor reports ready: a server that switches to a new version's actors
    answers its first searches at full speed, not after a compile (tens of seconds on a cold cache)."""
    import numpy as np

    if not len(shard.term_ids):
        return
    rows = np.argsort(np.diff(shard.indptr))[-3:]
    query = WeightedQuery(tuple(str(t) for t in shard.term_ids[rows]), np.asarray(shard.term_ids[rows], np.int64),
                          np.ones(len(rows), np.float32))
    for scorer in ("pruned", "exhaustive"):
        for k in (10, 1000):
            shard.top_k_many([query], k, scorer=scorer)


class ShardActors:
    """One index version's shard actors as a Scorer (sira.core.query_path): scatter, gather, merge. Blocking:
    the server calls it on a worker thread."""

    def __init__(self, actors: list):
        self.actors = actors

    def retrieve(self, queries: Sequence[WeightedQuery], k: int, constraints: Sequence[Constraint] | None = None,
                 exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> list[Ranked]:
        per_shard = ray.get([a.top_k.remote(queries, k, constraints, exclude_doc_ids) for a in self.actors])
        return [merge_ranked([shard[i] for shard in per_shard], k) for i in range(len(queries))]

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        per_shard = ray.get([a.contributions.remote(query, doc_ids) for a in self.actors])
        return {d: terms for shard in per_shard for d, terms in shard.items()}


def start_shard_actors(warehouse: str, manifest: dict) -> list:
    actors = [ShardActor.remote(warehouse, manifest, s) for s in range(manifest["num_shards"])]
    ray.get([a.num_docs.remote() for a in actors])  # fail here, not at the first query, if a shard is broken
    return actors
