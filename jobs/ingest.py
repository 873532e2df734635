"""`sira ingest`: validate a corpus source and write the Delta `docs` table (bad records -> `rejected`); the
dataflow and its two modes (replace, merge) are in sira.pipelines.storage.ingest."""

from __future__ import annotations

from sira.pipelines.tracking.console import progress_bar
from sira.pipelines.storage.ingest import IngestConfig, ingest


def run(cfg: IngestConfig) -> dict:
    return ingest(cfg, progress_bar)
