"""The query-side expansion cache: the Delta `expansions` table, keyed by query text (its hash), model and prompt
version. Read by serving and written by sira.pipelines.enrichment.query_expansion, without importing Ray."""

from __future__ import annotations

import hashlib
from typing import Collection

import pyarrow as pa
import pyarrow.compute as pc

from sira.core import tables
from sira.core.proposers import Proposal
from sira.pipelines.storage.delta_io import read_table, table_exists


QUERY_MAX_N = 4  # expansion phrases have 1..4 words


def query_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def cached_expansions(warehouse: str, model: str, prompt_version: str,
                      hashes: Collection[str] | None = None) -> dict[str, Proposal]:
    """query_hash -> proposal of every successful expansion for (model, prompt_version); with `hashes`, of those
    queries only: the filter runs in the scan, so a run that asks chunk by chunk builds proposals for its chunk, not
    for the whole table."""
    uri = tables.table_uri(warehouse, tables.EXPANSIONS)
    if not table_exists(uri):
        return {}
    return proposals_of(read_table(uri, filters=_key(model, prompt_version, hashes)))


def proposals_of(rows: pa.Table) -> dict[str, Proposal]:
    """query_hash -> proposal of the successful rows of an expansions table (or of a chunk written to it)."""
    t = rows.filter(pc.is_null(rows["error"]))
    weights = t["weights"].to_pylist() if "weights" in t.schema.names else [None] * t.num_rows
    return {h: Proposal(list(p or []), list(w) if w is not None else [1.0] * len(p or []))
            for h, p, w in zip(t["query_hash"].to_pylist(), t["phrases"].to_pylist(), weights)}


def _key(model: str, prompt_version: str, hashes: Collection[str] | None) -> list[tuple]:
    key = [("model", "=", model), ("prompt_version", "=", prompt_version)]
    return key + [("query_hash", "in", sorted(hashes))] if hashes is not None else key


def errored_expansions(warehouse: str, model: str, prompt_version: str,
                       hashes: Collection[str] | None = None) -> pa.Table | None:
    """query_hash of every errored expansion for (model, prompt_version) (None: no table); with `hashes`, of those
    queries only."""
    uri = tables.table_uri(warehouse, tables.EXPANSIONS)
    if not table_exists(uri):
        return None
    t = read_table(uri, columns=["query_hash", "error"], filters=_key(model, prompt_version, hashes))
    return t.filter(pc.is_valid(t["error"])).select(["query_hash"])
