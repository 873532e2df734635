"""Corpus-side enrichment of a warehouse (`sira enrich`, and `sira eval` when its index needs it): ask a proposer for
the missing search vocabulary of each document that has none yet for this model and prompt (sira.pipelines.enrichment.ray_enrich)."""

from __future__ import annotations

import time
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from sira.pipelines.storage.ingest import Progress
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.ray_enrich import COMMIT_EVERY, COMMIT_INTERVAL_S


class EnrichConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    backend: BackendConfig = Field(default_factory=BackendConfig)
    task: str | None = Field(None, description="prompt task; default: the one recorded for the warehouse at ingest")
    max_n: int = Field(3, ge=1, le=4, description="longest phrase, in words")
    commit_every: int = Field(COMMIT_EVERY, gt=0, description="most rows per Delta commit (the most a killed job "
                                                              "can lose)")
    commit_interval_s: float = Field(COMMIT_INTERVAL_S, gt=0, description="commit what has arrived once this long has "
                                                                          "passed since the last commit (a slow backend "
                                                                          "loses little when killed)")
    limit: int | None = Field(None, gt=0, description="enrich at most this many documents (smoke runs)")
    retry_errors: bool = Field(True, description="run documents whose recorded answer is an error again; "
                                                "False leaves them (and counts them as skipped)")
    ray_address: str | None = None
    preset: str | None = Field(None, description="encoder: the plain index whose vocabulary is proposed "
                                                 "(default: the newest plain index)")
    embeddings: bool = Field(True, description="encoder: also keep each document's vector, which it computes anyway "
                                               "(the dense variants' corpus side; 1.5 KB a document)")


def encoder_vocabulary(warehouse: str, backend: BackendConfig, preset: str | None, log: Callable[[str], None]):
    """The vocabulary of the newest plain (not enriched) index: what the encoder proposer proposes from."""
    from sira.pipelines.enrichment.encoder_proposer import load_vocabulary
    from sira.pipelines.index.catalog import IndexNotFound, find_index

    try:
        manifest = find_index(warehouse, preset=preset, enriched=False)
    except IndexNotFound as exc:
        raise IndexNotFound(f"{exc}: the encoder proposer proposes from the vocabulary of a plain index; "
                            f"build one first with `sira index --warehouse {warehouse} --no-enrichment`") from None
    return load_vocabulary(warehouse, manifest, backend.encoder, log), manifest["analyzer_json"]


def enrich_corpus(cfg: EnrichConfig, log: Callable[[str], None], progress: Progress,
                  on_commit: Callable[[dict], None] = lambda stats: None) -> dict:
    """Enrich what the warehouse lacks; `on_commit` gets each Delta commit's statistics (ProposalWriter.write)."""
    from sira.pipelines.enrichment.ray_enrich import docs_to_enrich, enrich, init_ray
    from sira.pipelines.storage.warehouse_info import warehouse_task
    from sira.core.enrichment import load_template

    task = warehouse_task(cfg.warehouse, cfg.task)
    template = load_template("doc", task)
    model = cfg.backend.model_id()
    version = cfg.backend.proposal_version(template.version)
    todo, skipped = docs_to_enrich(cfg.warehouse, model, version, cfg.retry_errors)
    documents = todo.num_rows + skipped  # counted before --limit, which only defers work
    if cfg.limit is not None:
        todo = todo.limit(cfg.limit)
    log(f"enrich: {todo.num_rows} documents to do, {skipped} already enriched "
        f"(backend {cfg.backend.backend}, model {model}, version {version})")
    started = time.perf_counter()
    counters = {"enriched": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0, "commits": 0, "commit_seconds": 0.0}
    if todo.num_rows:
        vocabulary, analyzer_json, keep = None, None, lambda chunk: None
        if cfg.backend.backend == "encoder":
            from sira.pipelines.enrichment.embeddings import keep_vectors

            vocabulary, analyzer_json = encoder_vocabulary(cfg.warehouse, cfg.backend, cfg.preset, log)
            keep = keep_vectors(cfg.warehouse, cfg.backend.encoder.max_tokens, cfg.backend.encoder.model) if cfg.embeddings else keep
        init_ray(cfg.ray_address)
        with progress("enrich", todo.num_rows, "docs") as advance:
            counters = enrich(cfg.warehouse, todo, template, cfg.backend, cfg.max_n, cfg.commit_every, advance,
                              vocabulary, analyzer_json, cfg.commit_interval_s, on_commit, keep)
    seconds = time.perf_counter() - started
    done = counters["enriched"] + counters["errors"]
    return {
        "documents": documents,
        "enriched": counters["enriched"],
        "skipped": skipped,
        "errors": counters["errors"],
        "input_tokens": counters["input_tokens"],
        "output_tokens": counters["output_tokens"],
        "seconds": seconds,
        "commits": counters["commits"],
        "commit_seconds": counters["commit_seconds"],
        "docs_per_second": done / seconds if seconds > 0 and done else 0.0,
        "output_tokens_per_second": counters["output_tokens"] / seconds if seconds > 0 else 0.0,
        "model": model,
        "prompt_version": version,
        "backend": cfg.backend.backend,
    }



def log_failures(summary: dict, log: Callable[[str], None], retried_by: str) -> None:
    """Failed documents do not stop a pipeline: say that they are indexed plain and tried again by `retried_by`."""
    if summary["errors"]:
        log(f"[yellow]enrichment: {summary['errors']} documents failed; they are indexed without enrichment and "
            f"retried by {retried_by}[/yellow]")


def enrichment_sample(warehouse: str, summary: dict, n: int = 50) -> list[dict]:
    """The first `n` documents' proposals of the enrichment `summary` reports (its model and prompt version), for a
    reader of the tracked run."""
    import json

    import pyarrow.compute as pc

    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    t = read_table(tables.table_uri(warehouse, tables.ENRICHMENT))
    t = t.select([c for c in ("doc_id", "model", "prompt_version", "phrases", "weights", "error") if c in t.schema.names])
    t = t.filter(pc.and_(pc.equal(t["model"], summary["model"]), pc.equal(t["prompt_version"], summary["prompt_version"])))
    return json.loads(json.dumps(t.sort_by("doc_id").slice(0, n).to_pylist(), default=str))
