"""Shards held by Ray actors and queried scatter-gather: each actor scores a batch of compiled queries on
its shard (memory-mapped from the local shard cache, so actors of one machine share its pages); the caller
merges the per-shard top-k columns (sira.core.search.merge_ranked)."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import ray

from sira.pipelines.shard_cache import cached_shard
from sira.pipelines.shard_loader import load_shard
from sira.core.bm25 import WeightedQuery
from sira.core.hashing import term_id


@ray.remote(num_cpus=0.25)  # fractional: on small machines whole-CPU actors starve everything else
class ShardActor:
    def __init__(self, warehouse: str, manifest: dict, shard: int):
        self.shard = cached_shard(warehouse, manifest, shard, load_shard)

    def num_docs(self) -> int:
        return self.shard.num_docs

    def top_k(self, queries: Sequence[WeightedQuery], k: int,
              constraints: Sequence[tuple[Sequence[str], Sequence[str]]] | None = None):
        """[(doc ids (Arrow), scores (float64))] per query, best first; constraints[i] = (must terms, exclude
        terms)."""
        ids = [([term_id(t) for t in must], [term_id(t) for t in exclude]) for must, exclude in constraints or ()]
        ords, scores, counts = self.shard.top_k_many(queries, k, ids or None)
        return [(self.shard.doc_ids.take(pa.array(ords[i, : counts[i]])), scores[i, : counts[i]])
                for i in range(len(queries))]

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """Per-term contributions (ShardIndex.contributions) of those of `doc_ids` this shard holds."""
        return {self.shard.doc_ids[int(o)].as_py(): self.shard.contributions(int(o), query)
                for o in self.shard.ords_of(doc_ids)}


def start_shard_actors(warehouse: str, manifest: dict) -> list:
    actors = [ShardActor.remote(warehouse, manifest, s) for s in range(manifest["num_shards"])]
    ray.get([a.num_docs.remote() for a in actors])  # fail here, not at the first query, if a shard is broken
    return actors
