"""SIRA's engine-free core: analysis, BM25 scoring with exact pruning, retrieval programs, the DF filters and the
metrics; no Spark, Ray or Delta. The names below are its public API for use as a library, e.g.

    from sira.core import build_searcher, get_preset
    searcher = build_searcher([("d1", "Aspirin", "Aspirin lowers fever.")], get_preset("sira"))
    searcher.search("fever", k=10)

Everything else in the package may change between releases. Names load on first use (importing `sira_core`
alone costs nothing)."""

from __future__ import annotations

import importlib

_HOMES = {
    "Analyzer": "analysis", "AnalyzerConfig": "analysis",
    "IndexPreset": "presets", "get_preset": "presets", "PRESETS": "presets",
    "Searcher": "search", "Hit": "search", "Ranking": "search", "QueryPart": "search",
    "build_searcher": "memory_index",
    "RetrievalProgram": "program", "Expansion": "program",
    "QueryPath": "query_path", "Scorer": "query_path",
    "Retriever": "retriever", "hits_by_query": "retriever", "TermProposer": "proposers", "Proposal": "proposers",
    "DFTable": "dfstats", "corpus_side_filter": "dfstats", "query_side_filter": "dfstats",
    "evaluate_run": "metrics", "paired_comparison": "metrics", "read_trec_run": "metrics", "write_trec_run": "metrics",
    "DEFAULT_TAU": "defaults",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'sira.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sira.core.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
