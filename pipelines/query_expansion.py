"""Query side: expected-response sketches for a set of queries, cached in the Delta `expansions` table by
query text, model and prompt version (a query asked again costs nothing)."""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.delta_io import read_table, table_exists
from pipelines.llm_backends import BackendConfig
from pipelines.ray_enrich import init_ray, propose
from sira_core import tables
from sira_core.enrichment import load_template

QUERY_MAX_N = 4  # expansion phrases have 1..4 words


def query_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def cached_expansions(warehouse: str, model: str, prompt_version: str) -> dict[str, list[str]]:
    """query_hash -> phrases of every successful expansion for (model, prompt_version)."""
    uri = tables.table_uri(warehouse, tables.EXPANSIONS)
    if not table_exists(uri):
        return {}
    t = read_table(uri, columns=["query_hash", "model", "prompt_version", "phrases", "error"])
    t = t.filter(pc.and_(pc.and_(pc.equal(t["model"], model), pc.equal(t["prompt_version"], prompt_version)),
                         pc.is_null(t["error"])))
    return dict(zip(t["query_hash"].to_pylist(), t["phrases"].to_pylist()))


def expand_queries(
    warehouse: str,
    queries: Mapping[str, str],
    task: str,
    backend: BackendConfig,
    ray_address: str | None = None,
    commit_every: int = 64,
    on_progress: Callable[[int], None] = lambda n: None,
) -> tuple[dict[str, list[str]], dict]:
    """Phrases per query id (empty where the LLM failed), and counters of the work done now."""
    template = load_template("query", task)
    model = backend.model_id()
    cached = cached_expansions(warehouse, model, template.version)
    by_hash = {query_hash(text): text for text in queries.values()}
    todo = sorted(h for h in by_hash if h not in cached)
    counters = {"expanded": 0, "errors": 0, "cached": len(by_hash) - len(todo), "input_tokens": 0, "output_tokens": 0}
    if todo:
        init_ray(ray_address)
        table = pa.table({"query_hash": todo, "query": [by_hash[h] for h in todo]})
        done = propose(warehouse, tables.EXPANSIONS, table, ("query_hash", "query"),
                       lambda row: template.render(row["query"], QUERY_MAX_N), template.version, backend,
                       QUERY_MAX_N, commit_every, on_progress)
        counters.update(expanded=done["enriched"], errors=done["errors"], input_tokens=done["input_tokens"],
                        output_tokens=done["output_tokens"])
        cached = cached_expansions(warehouse, model, template.version)
    phrases = {qid: cached.get(query_hash(text), []) for qid, text in queries.items()}
    return phrases, {**counters, "model": model, "prompt_version": template.version}
