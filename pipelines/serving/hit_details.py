"""What a page shows of a hit beyond its id and score: its title, a snippet, its per-term contributions told apart
by query part, and the terms it holds only through the enrichment phrases the index injected into it. Read from
the Delta tables the index version was built from (its docs table version and its injections rows), for the few
documents asked about."""

from __future__ import annotations

from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sira.pipelines.storage.delta_io import read_table
from sira.core import tables
from sira.core.analysis import Analyzer, index_text
from sira.core.explain import explain_hit, snippet
from sira.core.program import RetrievalProgram


def read_documents(warehouse: str, doc_ids: Sequence[str], docs_version: int | None = None) -> dict[str, dict]:
    """doc_id -> {"title", "text"} of those of `doc_ids` the docs table holds (at `docs_version`; None: the
    newest)."""
    if not doc_ids:
        return {}
    t = read_table(tables.table_uri(warehouse, tables.DOCS), docs_version, [("doc_id", "in", sorted(set(doc_ids)))],
                   ["doc_id", "title", "text"])
    return {d: {"title": title, "text": text}
            for d, title, text in zip(t["doc_id"].to_pylist(), t["title"].to_pylist(), t["text"].to_pylist())}


def injected_phrases(warehouse: str, manifest: dict, doc_ids: Sequence[str]) -> dict[str, list[str]]:
    """doc_id -> the enrichment phrases index version `manifest` injected into it (kept by the corpus-side DF
    filter), in proposal order; documents without any are left out, as are all of a plain index's."""
    if not doc_ids or not manifest.get("enriched"):
        return {}
    t = version_injections(warehouse, manifest, doc_ids)
    if t is None:
        return {}
    t = t.filter(pc.field("kept")).sort_by([("doc_id", "ascending"), ("position", "ascending")])
    out: dict[str, list[str]] = {}
    for d, phrase in zip(t["doc_id"].to_pylist(), t["phrase"].to_pylist()):
        out.setdefault(d, []).append(phrase)
    return out


def version_injections(warehouse: str, manifest: dict, doc_ids: Sequence[str] | None = None) -> pa.Table | None:
    """(doc_id, position, phrase, kept, reason, min_df): the DF rule's decisions on the candidate phrases of the
    documents (`doc_ids`, or all) of enriched index version `manifest`; None for a version without them. Each
    document's decisions are those its segment keeps (sira.core.tables.SEGMENT_INJECTIONS): the newest of the
    version's segments that holds it, where its live row is (a document that enters again enters a newer segment)."""
    columns = ["doc_id", "position", "phrase", "kept", "reason", "min_df"]
    ids = [("doc_id", "in", sorted(set(doc_ids)))] if doc_ids is not None else []
    if manifest.get("segment_injections_table_version") is None:
        if manifest.get("injections_table_version") is None:
            return None
        return read_table(tables.table_uri(warehouse, tables.INJECTIONS), manifest["injections_table_version"],
                          [("index_version", "=", manifest["index_version"]), *ids], columns)
    segments = [("segment", "in", list(manifest["segments"]))]
    held = read_table(tables.table_uri(warehouse, tables.SEGMENT_DOCS), manifest["segment_docs_table_version"],
                      [*segments, *ids], ["doc_id", "segment"])
    live = held.group_by("doc_id").aggregate([("segment", "max")]).rename_columns(["doc_id", "segment"])
    rows = read_table(tables.table_uri(warehouse, tables.SEGMENT_INJECTIONS),
                      manifest["segment_injections_table_version"], [*segments, *ids], ["segment", *columns])
    return rows.join(live, ["doc_id", "segment"], join_type="inner").select(columns)


def hit_details(warehouse: str, manifest: dict, analyzer: Analyzer, program: RetrievalProgram,
                contributions: Mapping[str, Mapping[str, float]]) -> dict[str, dict]:
    """doc_id -> {"title", "snippet", "contributions", "injected"} for each hit of `program` on index version
    `manifest` (`contributions`: doc_id -> term -> contribution, as the shards explain them). A term the document's
    own title and text do not hold matched only through its injected phrases (`enrichment_only`)."""
    ids = list(contributions)
    docs = read_documents(warehouse, ids, manifest["docs_table_version"])
    injected = injected_phrases(warehouse, manifest, ids)
    out = {}
    for doc_id, terms in contributions.items():
        doc = docs.get(doc_id, {"title": "", "text": ""})
        own = analyzer.terms(index_text(doc["title"], doc["text"]))
        out[doc_id] = {
            "title": doc["title"],
            "snippet": snippet(doc["text"], terms, analyzer),
            "contributions": explain_hit(program, terms, own, injected.get(doc_id, []), analyzer),
            "injected": injected.get(doc_id, []),
        }
    return out
