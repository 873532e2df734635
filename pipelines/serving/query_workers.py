"""Query-parallel scoring for bulk runs (`sira query --scorer workers`): each worker is a Ray actor that maps every
shard of the index version from the machine's shard cache (sira.pipelines.serving.shard_cache: the workers of one
machine share its pages, so they hold about one copy of the index between them) and takes whole batches of
queries: programs, DF validation, scoring and the results table, in its own process. The driver only reads the
query file, hands out batches and commits. Scatter-gather over shard actors (sira.pipelines.serving.shard_actors)
keeps every shard's work in one process, and the driver builds the programs and merges the shards' hits of every
batch while the actors wait: what an online server needs (one query, every core), not a query set.

Batches are handed out round-robin as soon as a chunk is submitted and come back in order, so a chunk's scoring
runs while the driver expands the next chunk and commits the one before (jobs/query.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa
import ray

from sira.core.proposers import Proposal
from sira.core.retriever import RESULTS_SCHEMA, results_table

# Ray's CPU accounting, not a core each worker may use: the expansion dataflow beside them asks for one encoder actor
# of half a CPU per CPU of the cluster plus its small tasks, so the workers' whole claim must leave that free (with
# half a CPU each, `sira query` on 2 cores waits forever for a CPU to render its prompts on).
WORKER_CPUS = 0.25


@ray.remote(num_cpus=WORKER_CPUS, max_concurrency=1)
class QueryWorker:
    """Every shard of one index version, memory-mapped in this process, and its query path."""

    def __init__(self, warehouse: str, manifest: dict, tau: float, expand: bool):
        os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one core per worker: the workers are the parallelism
        from sira.pipelines.serving.shard_actors import warm_up
        from sira.pipelines.serving.shard_loader import load_query_path, load_searcher

        searcher, _ = load_searcher(warehouse, manifest["index_version"])
        for shard in searcher.shards:
            warm_up(shard)  # kernels compiled (or loaded from numba's cache) before the first batch
        self.path = load_query_path(warehouse, manifest, searcher, tau, expand)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def score(self, qids: Sequence[str], texts: Sequence[str], proposals: Sequence[Proposal] | None,
              how: "Scoring") -> tuple[list[str], pa.Table]:
        """The batch's programs (JSON, in input order) and its results (sira.core.retriever.RESULTS_SCHEMA)."""
        programs = self.path.programs(texts, proposals, how.w, how.proposer, how.prompt_version)
        results = results_table(qids, programs, self.path.rank(programs, how.k))
        return [p.model_dump_json() for p in programs], results


@dataclass(frozen=True)
class Scoring:
    """What every batch of a run is scored with: depth, expansion weight, and the proposer the programs record."""

    k: int
    w: float
    proposer: str = ""
    prompt_version: str | None = None


@dataclass
class Submitted:
    """A chunk's batches in flight: (batch size, the worker's answer) in input order."""

    parts: list[tuple[int, ray.ObjectRef]]


class QueryWorkers:
    """`workers` query workers over one index version (0: one per CPU of the Ray cluster), spread over its nodes,
    as the ChunkScorer of a bulk run (sira.pipelines.serving.query_runs)."""

    def __init__(self, warehouse: str, manifest: dict, how: Scoring, batch_size: int, tau: float, expand: bool,
                 workers: int = 0):
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.how, self.batch_size = ray.put(how), batch_size  # in the object store once, not once per batch
        self.actors = [QueryWorker.options(scheduling_strategy="SPREAD").remote(warehouse, manifest, tau, expand)
                       for _ in range(n)]
        self.nodes = ray.get([a.node_id.remote() for a in self.actors])  # fail here if a worker cannot load
        self._next = 0

    def submit(self, qids: Sequence[str], texts: Sequence[str], proposals: Sequence[Proposal] | None,
               advance: Callable[[int], None] = lambda n: None) -> Submitted:
        """Hand a chunk's queries to the workers in batches, round-robin; returns at once."""
        parts = []
        for start in range(0, len(qids), self.batch_size):
            end = min(start + self.batch_size, len(qids))
            actor = self.actors[self._next % len(self.actors)]
            self._next += 1
            batch = None if proposals is None else list(proposals[start:end])
            answer = actor.score.remote(list(qids[start:end]), list(texts[start:end]), batch, self.how)
            parts.append((end - start, answer))
        return Submitted(parts)

    @staticmethod
    def collect(submitted: Submitted, advance: Callable[[int], None] = lambda n: None) -> tuple[list[str], pa.Table]:
        """A submitted chunk's programs (JSON, input order) and results, batch by batch as they come back."""
        programs, tables = [], []
        for size, ref in submitted.parts:
            batch_programs, results = ray.get(ref)
            programs += batch_programs
            tables.append(results)
            advance(size)
        return programs, pa.concat_tables(tables) if tables else RESULTS_SCHEMA.empty_table()

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
