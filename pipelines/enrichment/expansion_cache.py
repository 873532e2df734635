"""The query-side expansion cache: the Delta `expansions` table, keyed by query text (its hash), model and prompt
version. Read by serving and written by sira.pipelines.enrichment.query_expansion, without importing Ray."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from sira.core import tables
from sira.core.proposers import Proposal
from sira.pipelines.storage.delta_io import read_table, table_exists


QUERY_MAX_N = 4  # expansion phrases have 1..4 words


def query_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def cached_expansions(warehouse: str, model: str, prompt_version: str) -> dict[str, Proposal]:
    """query_hash -> proposal of every successful expansion for (model, prompt_version)."""
    uri = tables.table_uri(warehouse, tables.EXPANSIONS)
    if not table_exists(uri):
        return {}
    t = read_table(uri)
    t = t.filter(pc.and_(pc.and_(pc.equal(t["model"], model), pc.equal(t["prompt_version"], prompt_version)),
                         pc.is_null(t["error"])))
    weights = t["weights"].to_pylist() if "weights" in t.schema.names else [None] * t.num_rows
    return {h: Proposal(list(p or []), list(w) if w is not None else [1.0] * len(p or []))
            for h, p, w in zip(t["query_hash"].to_pylist(), t["phrases"].to_pylist(), weights)}


def errored_expansions(warehouse: str, model: str, prompt_version: str) -> pa.Table | None:
    """query_hash of every errored expansion for (model, prompt_version) (None: no table)."""
    uri = tables.table_uri(warehouse, tables.EXPANSIONS)
    if not table_exists(uri):
        return None
    t = read_table(uri, columns=["query_hash", "model", "prompt_version", "error"])
    return t.filter(pc.and_(pc.and_(pc.equal(t["model"], model), pc.equal(t["prompt_version"], prompt_version)),
                            pc.is_valid(t["error"]))).select(["query_hash"])
