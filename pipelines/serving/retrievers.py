"""Retrievers over a warehouse's published index: `open_retriever` opens an index version, in process (the
memory-mapped shard cache) or as Ray shard actors, and puts a query-side proposer in front of it.

The proposers (sira.core.proposers.TermProposer) a retriever can ask:
- `CachedBatchProposer`: the query-expansion dataflow (Ray Data; any backend, the encoder included) with its Delta
  cache, for query sets (`sira eval`, `sira query`);
- `OnlineProposer` (sira.pipelines.serving.online_proposer): one query at a time, the server's and `sira search
  --expand`'s;
- none: plain queries.
Both take the prompt task from the warehouse unless given (`warehouse_task`: --task, else the one recorded at ingest).
"""

from __future__ import annotations

from typing import Callable, Sequence

from sira.core.defaults import DEFAULT_TAU, QUERY_BATCH, SEARCH_K
from sira.core.enrichment import load_template
from sira.core.proposers import Proposal, TermProposer
from sira.core.retriever import Retriever
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.serving.shard_loader import load_query_path
from sira.pipelines.storage.warehouse_info import warehouse_task


class CachedBatchProposer:
    """Proposals for a query set through the query-expansion dataflow, cached in the Delta `expansions` table by
    query text, model and prompt version: a query asked before costs nothing. `summary`: the counters of the last
    call (expanded, cached, errors, tokens, model, prompt_version)."""

    def __init__(self, warehouse: str, backend: BackendConfig, task: str | None, manifest: dict,
                 ray_address: str | None = None, on_progress: Callable[[int], None] = lambda n: None):
        task = warehouse_task(warehouse, task)
        self.warehouse, self.backend, self.task, self.manifest = warehouse, backend, task, manifest
        self.ray_address, self.on_progress = ray_address, on_progress
        self.name = backend.model_id()
        self.version = backend.proposal_version(load_template("query", task).version)
        self.default_w = backend.resolve_w(None)
        self.summary: dict | None = None

    def propose(self, texts: Sequence[str]) -> list[Proposal]:
        from sira.pipelines.enrichment.query_expansion import expand_queries  # Ray Data: loaded when asked

        keyed = {str(i): text for i, text in enumerate(texts)}
        proposals, self.summary = expand_queries(self.warehouse, keyed, self.task, self.backend, self.ray_address,
                                                 on_progress=self.on_progress, manifest=self.manifest)
        return [proposals[key] for key in keyed]


def open_retriever(warehouse: str, index_version: int | None = None, preset: str | None = None, *,
                   enriched: bool | None = None, scorer: str = "local",
                   proposer: TermProposer | Callable[[dict], TermProposer] | None = None,
                   tau: float = DEFAULT_TAU, w: float | None = None, k: int = SEARCH_K, exclude_self: bool = False,
                   batch_size: int = QUERY_BATCH, manifest: dict | None = None) -> tuple[Retriever, dict]:
    """A Retriever over one published index version (`manifest`, or the newest matching `index_version`, `preset`
    and `enriched`) and that version's manifest row. `scorer`: "local" (this process maps the shard cache) or
    "actors" (a Ray actor per shard, scatter-gather). `proposer`: one, or a function of the manifest that makes one
    (the encoder proposes from the version's vocabulary); the DFs that validate proposals are read only with one."""
    from sira.pipelines.index.catalog import find_index

    if scorer not in ("local", "actors"):
        raise ValueError(f"scorer must be local or actors, got {scorer!r}")
    manifest = manifest or find_index(warehouse, index_version, preset, enriched)
    if proposer is not None and not hasattr(proposer, "propose"):
        proposer = proposer(manifest)
    if scorer == "local":
        from sira.pipelines.serving.shard_loader import load_searcher

        scoring, _ = load_searcher(warehouse, manifest["index_version"])
    else:
        from sira.pipelines.serving.shard_actors import ShardActors, start_shard_actors

        scoring = ShardActors(start_shard_actors(warehouse, manifest))
    path = load_query_path(warehouse, manifest, scoring, tau, expand=proposer is not None)
    return Retriever(path, proposer, w, k, exclude_self, batch_size), manifest
