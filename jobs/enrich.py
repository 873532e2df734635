"""`sira enrich`: the Ray Data job that asks an LLM backend for each document's missing search vocabulary (the
dataflow is in sira.pipelines.enrichment.corpus_enrichment)."""

from __future__ import annotations

from typing import Callable

from sira.pipelines.tracking.console import console, progress_bar
from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig


def run(cfg: EnrichConfig, on_commit: Callable[[dict], None] = lambda stats: None) -> dict:
    """Enrich what the warehouse lacks; `on_commit` gets each Delta commit's statistics (ProposalWriter.write)."""
    from sira.pipelines.enrichment.corpus_enrichment import enrich_corpus

    return enrich_corpus(cfg, console.log, progress_bar, on_commit)
