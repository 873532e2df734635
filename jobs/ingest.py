"""`sira ingest`: validate a corpus source and write the Delta `docs` table (bad records -> `rejected`); the
dataflow and its two modes (replace, merge) are in pipelines.ingest."""

from __future__ import annotations

from jobs.progress import progress_bar
from pipelines.ingest import IngestConfig, ingest


def run(cfg: IngestConfig) -> dict:
    return ingest(cfg, progress_bar)
