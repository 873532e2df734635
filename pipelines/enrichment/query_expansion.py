"""Query side: proposals (expected-response sketches from an LLM, or the encoder's nearest vocabulary) for a
set of queries, cached in the Delta `expansions` table by query text, model and prompt version (a query asked
again costs nothing)."""

from __future__ import annotations

from typing import Callable, Mapping

import pyarrow as pa

from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.ray_enrich import init_ray, propose, with_replaces_error
from sira.pipelines.enrichment.expansion_cache import (QUERY_MAX_N, cached_expansions, errored_expansions,
                                                       proposals_of, query_hash)
from sira.core import tables
from sira.core.enrichment import load_template
from sira.core.proposers import Proposal


def expand_queries(
    warehouse: str,
    queries: Mapping[str, str],
    task: str,
    backend: BackendConfig,
    ray_address: str | None = None,
    commit_every: int = 1024,  # rows per commit; a slow backend also commits every COMMIT_INTERVAL_S
    on_progress: Callable[[int], None] = lambda n: None,
    manifest: dict | None = None,
) -> tuple[dict[str, Proposal], dict]:
    """A proposal per query id (empty where the proposer failed), and counters of the work done now.
    The encoder proposer needs `manifest`: the index whose vocabulary it proposes from."""
    template = load_template("query", task)
    model = backend.model_id()
    version = backend.proposal_version(template.version)
    by_hash = {query_hash(text): text for text in queries.values()}
    cached = cached_expansions(warehouse, model, version, by_hash)
    todo = sorted(h for h in by_hash if h not in cached)
    counters = {"expanded": 0, "errors": 0, "cached": len(by_hash) - len(todo), "input_tokens": 0, "output_tokens": 0}
    on_progress(sum(query_hash(text) in cached for text in queries.values()))  # answered already: counted as done
    if todo:
        vocabulary = analyzer_json = None
        if backend.backend == "encoder":
            from sira.pipelines.enrichment.encoder_proposer import load_vocabulary

            if manifest is None:
                raise ValueError("the encoder proposer needs the index it expands for (its vocabulary)")
            vocabulary, analyzer_json = load_vocabulary(warehouse, manifest, backend.encoder), manifest["analyzer_json"]
        init_ray(ray_address)
        table = with_replaces_error(pa.table({"query_hash": todo, "query": [by_hash[h] for h in todo]}),
                                    errored_expansions(warehouse, model, version, todo), ("query_hash",))
        render = (lambda row: row["query"]) if backend.backend == "encoder" else \
            (lambda row: template.render(row["query"], QUERY_MAX_N))
        done = propose(warehouse, tables.EXPANSIONS, table, ("query_hash", "query"), render, version, backend,
                       QUERY_MAX_N, commit_every, on_progress, vocabulary, analyzer_json,
                       after_commit=lambda chunk: cached.update(proposals_of(chunk)))
        counters.update(expanded=done["enriched"], errors=done["errors"], input_tokens=done["input_tokens"],
                        output_tokens=done["output_tokens"])
    proposals = {qid: cached.get(query_hash(text), Proposal([], [])) for qid, text in queries.items()}
    return proposals, {**counters, "model": model, "prompt_version": version}
