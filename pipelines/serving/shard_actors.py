"""Shards held by Ray actors and queried scatter-gather: each actor scores a batch of compiled queries on
its shard (memory-mapped from the local shard cache, so actors of one machine share its pages); ShardActors
sends the batch to every actor and merges their per-shard top-k batches (sira.core.search.merge_batches), so it
ranks exactly like the in-process Searcher. Both are the Scorer of sira.core.query_path."""

from __future__ import annotations

from typing import Iterable, Sequence

import pyarrow as pa
import ray

from sira.pipelines.serving.shard_cache import cached_shard
from sira.pipelines.serving.shard_loader import load_shard
from sira.core.bm25 import WeightedQuery
from sira.core.hashing import term_id
from sira.core.query_path import Constraint
from sira.core.search import RankedBatch, merge_batches


@ray.remote(num_cpus=0.25, max_concurrency=4)  # fractional: on small machines whole-CPU actors starve the rest
class ShardActor:
    """One shard of one or more index versions: a server that follows a night loads the new version into the
    actors it has (no process to start, kernels already loaded) while they go on answering from the old one
    (threaded actor), then drops the old one."""

    def __init__(self, warehouse: str, manifest: dict, shard: int):
        self.warehouse, self.shard_number = warehouse, shard
        self.versions: dict[int, object] = {}
        self.load(manifest)

    def load(self, manifest: dict) -> int:
        """Hold the manifest's version too; returns its number. A version not cached yet is served from memory as
        soon as it is assembled, and from the shared memory-mapped cache once written (the same arrays)."""
        v = manifest["index_version"]
        if v not in self.versions:
            shard = cached_shard(self.warehouse, manifest, self.shard_number, load_shard,
                                 write_behind=lambda mapped: self._mapped(v, mapped))
            warm_up(shard)
            self.versions[v] = shard
        return v

    def _mapped(self, version: int, shard) -> None:
        if version in self.versions:
            self.versions[version] = shard

    def drop(self, version: int) -> None:
        self.versions.pop(version, None)

    def _shard(self, version: int | None):
        return self.versions[max(self.versions) if version is None else version]

    def num_docs(self, version: int | None = None) -> int:
        return self._shard(version).num_docs

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def top_k(self, queries: Sequence[WeightedQuery], k: int, constraints: Sequence[Constraint] | None = None,
              exclude_doc_ids: Sequence[Iterable[str]] | None = None, version: int | None = None) -> RankedBatch:
        """Each query's hits on this shard alone, best first, as one batch (its doc ids taken at once)."""
        shard = self._shard(version)
        ids = [([term_id(t) for t in must], [term_id(t) for t in exclude]) for must, exclude in constraints or ()]
        skip = [shard.ords_of(e) for e in exclude_doc_ids] if exclude_doc_ids is not None else None
        ords, scores, counts = shard.top_k_many(queries, k, ids or None, skip)
        return RankedBatch.of_grid(lambda kept: shard.doc_ids.take(pa.array(kept)), ords, scores, counts)

    def top_k_of(self, batch: tuple, k: int, version: int | None = None) -> RankedBatch:
        """top_k of a (queries, constraints, exclude_doc_ids) batch put in the object store once for every actor."""
        queries, constraints, exclude_doc_ids = batch
        return self.top_k(queries, k, constraints, exclude_doc_ids, version)

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str], version: int | None = None
                      ) -> dict[str, dict[str, float]]:
        """Per-term contributions (ShardIndex.contributions) of those of `doc_ids` this shard holds."""
        shard = self._shard(version)
        return {shard.doc_ids[int(o)].as_py(): shard.contributions(int(o), query) for o in shard.ords_of(doc_ids)}


def warm_up(shard) -> None:
    """Score a query of the shard's longest posting lists with each scorer, so that its kernels are compiled (or
    loaded from numba's cache) before the actor reports ready: a server that switches to a new version's actors
    answers its first searches at full speed, not after a compile (tens of seconds on a cold cache)."""
    import numpy as np

    if not len(shard.term_ids):
        return
    lengths = np.diff(shard.indptr)
    # the three longest lists, without sorting millions of lengths
    rows = np.sort(np.argpartition(lengths, -3)[-3:]) if len(lengths) > 3 else np.arange(len(lengths))
    query = WeightedQuery(tuple(str(t) for t in shard.term_ids[rows]), np.asarray(shard.term_ids[rows], np.int64),
                          np.ones(len(rows), np.float32))
    for scorer in ("pruned", "exhaustive"):
        for k in (10, 1000):
            shard.top_k_many([query], k, scorer=scorer)


class ShardActors:
    """One index version's shard actors as a Scorer (sira.core.query_path): scatter, gather, merge. Blocking:
    the server calls it on a worker thread. `version`: the index version to score on (None: the newest the
    actors hold)."""

    def __init__(self, actors: list, version: int | None = None):
        self.actors = actors
        self.version = version
        self.nodes = ray.get([a.node_id.remote() for a in actors])  # the Ray node of each shard, in shard order

    def retrieve(self, queries: Sequence[WeightedQuery], k: int, constraints: Sequence[Constraint] | None = None,
                 exclude_doc_ids: Sequence[Iterable[str]] | None = None) -> RankedBatch:
        # The batch goes to the object store once, not pickled again for every actor.
        batch = ray.put((list(queries), constraints, exclude_doc_ids))
        per_shard = ray.get([a.top_k_of.remote(batch, k, self.version) for a in self.actors])
        return merge_batches(per_shard, k)

    def contributions(self, query: WeightedQuery, doc_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        per_shard = ray.get([a.contributions.remote(query, doc_ids, self.version) for a in self.actors])
        return {d: terms for shard in per_shard for d, terms in shard.items()}


def start_shard_actors(warehouse: str, manifest: dict) -> list:
    # SPREAD: on a cluster the shards go to as many nodes as there are, so every node's cores and memory score
    # (Ray's default packs them onto the fewest nodes that fit).
    actors = [ShardActor.options(scheduling_strategy="SPREAD").remote(warehouse, manifest, s)
              for s in range(manifest["num_shards"])]
    ray.get([a.num_docs.remote() for a in actors])  # fail here, not at the first query, if a shard is broken
    return actors


def load_into(actors: list, manifest: dict) -> None:
    """Load another version into running actors (one per shard, in shard order); on a failure, the actors that
    loaded it drop it again and the error is raised."""
    try:
        ray.get([a.load.remote(manifest) for a in actors])
    except Exception:
        ray.get([a.drop.remote(manifest["index_version"]) for a in actors])
        raise
