"""The Ray Data proposal dataflow: rows -> prompt -> LLM backend -> parse -> a Delta proposals table
(`enrichment` for documents, `expansions` for queries).

Results are committed every `commit_every` rows with a Delta MERGE on the enrichment key, so a job killed
at any point keeps what it committed, and a rerun neither redoes nor duplicates it.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.delta_io import merge_rows, read_table, table_exists
from pipelines.llm_backends import BackendConfig, build_stage
from sira_core import tables
from sira_core.analysis import index_text
from sira_core.enrichment import PromptTemplate, document_input, parse_phrases


def docs_to_enrich(warehouse: str, model: str, prompt_version: str, retry_errors: bool = True) -> tuple[pa.Table, int]:
    """Docs whose current content has no enrichment for (model, prompt_version) yet; and how many were skipped."""
    docs = read_table(tables.table_uri(warehouse, tables.DOCS), columns=["doc_id", "title", "text", "content_hash"])
    uri = tables.table_uri(warehouse, tables.ENRICHMENT)
    if not table_exists(uri):
        return docs, 0
    done = read_table(uri, columns=["doc_id", "content_hash", "model", "prompt_version", "error"])
    done = done.filter(pc.and_(pc.equal(done["model"], model), pc.equal(done["prompt_version"], prompt_version)))
    if retry_errors:
        done = done.filter(pc.is_null(done["error"]))
    todo = docs.join(done.select(["doc_id", "content_hash"]), keys=["doc_id", "content_hash"], join_type="left anti")
    return todo.sort_by("doc_id"), docs.num_rows - todo.num_rows


def commit(warehouse: str, rows: pa.Table, table: str = tables.ENRICHMENT) -> None:
    """Upsert one chunk into a proposals table (enrichment or expansions): new keys are inserted; an errored
    row is replaced by its retry."""
    schema, key = PROPOSAL_TABLES[table]
    rows = rows.select(schema.names).cast(schema)
    merge_rows(tables.table_uri(warehouse, table), rows, key, replace_when="t.error IS NOT NULL")


PROPOSAL_TABLES = {
    tables.ENRICHMENT: (tables.ENRICHMENT_SCHEMA, tables.ENRICHMENT_KEY),
    tables.EXPANSIONS: (tables.EXPANSIONS_SCHEMA, tables.EXPANSIONS_KEY),
}


def enrich(
    warehouse: str,
    todo: pa.Table,
    template: PromptTemplate,
    backend: BackendConfig,
    max_n: int,
    commit_every: int = 256,
    on_progress: Callable[[int], None] = lambda n: None,
    vocabulary=None,
    analyzer_json: str | None = None,
    on_commit: Callable[[dict], None] = lambda stats: None,
) -> dict:
    """Corpus side: propose phrases for each doc of `todo` and commit them to `enrichment`. An LLM reads the
    rendered prompt; the encoder proposer reads the document itself."""
    if backend.backend == "encoder":
        def render(row: dict) -> str:
            return index_text(row["title"], row["text"])
    else:
        def render(row: dict) -> str:
            return template.render(document_input(row["title"], row["text"]), max_n)
    return propose(warehouse, tables.ENRICHMENT, todo, ("doc_id", "content_hash"), render,
                   backend.proposal_version(template.version), backend, max_n, commit_every, on_progress,
                   vocabulary, analyzer_json, on_commit)


def propose(
    warehouse: str,
    table: str,
    todo: pa.Table,
    carry: tuple[str, ...],
    render: Callable[[dict], str],
    prompt_version: str,
    backend: BackendConfig,
    max_words: int,
    commit_every: int = 256,
    on_progress: Callable[[int], None] = lambda n: None,
    vocabulary=None,
    analyzer_json: str | None = None,
    on_commit: Callable[[dict], None] = lambda stats: None,
) -> dict:
    """Run prompt -> proposer -> parse over `todo` with Ray Data and commit results in chunks to `table`
    (its key is `carry` + model + prompt_version); returns counters. `on_commit` gets each commit's rows and
    seconds."""
    import ray

    model, backend_name = backend.model_id(), backend.backend

    def make_prompt(row: dict) -> dict:
        return {**{c: row[c] for c in carry}, "prompt": render(row)}

    def parse(row: dict) -> dict:
        failed = bool(row.get("error"))
        weights = None
        if failed:
            phrases, parse_error = [], None
        elif row.get("proposed") is not None:  # the encoder proposer: phrases and weights, nothing to parse
            phrases, weights, parse_error = list(row["proposed"]), [float(w) for w in row["weights"]], None
        else:
            phrases, parse_error = parse_phrases(row.get("raw_output"), max_words=max_words)
        return {**{c: row[c] for c in carry}, "model": model,
                "prompt_version": prompt_version, "backend": backend_name, "phrases": phrases, "weights": weights,
                "raw_output": row.get("raw_output"), "input_tokens": int(row.get("input_tokens") or 0),
                "output_tokens": int(row.get("output_tokens") or 0),
                "latency_ms": float(row.get("latency_ms") or 0.0), "error": row.get("error") or parse_error,
                "enriched_at": datetime.now(timezone.utc)}

    counters = {"enriched": 0, "errors": 0, "input_tokens": 0, "output_tokens": 0}
    if todo.num_rows == 0:
        return counters
    # Small input blocks (one backend batch, at most one commit): a map task emits its output only when its whole
    # block is done, so one big block would hold every result back until the end (a killed job would lose them
    # all), and it would keep every engine but one idle (an actor takes a block at a time).
    rows = max(1, min(commit_every, backend.batch_size))
    blocks = [todo.slice(start, rows) for start in range(0, todo.num_rows, rows)]
    ds = ray.data.from_arrow(blocks).map(make_prompt, num_cpus=0.1)
    ds = build_stage(backend, vocabulary, analyzer_json)(ds).map(parse, num_cpus=0.1)
    for chunk in _chunks(ds, commit_every):
        started = time.perf_counter()
        commit(warehouse, chunk, table)
        on_commit({"rows": chunk.num_rows, "seconds": time.perf_counter() - started})
        errors = chunk.num_rows - pc.sum(pc.is_null(chunk["error"]).cast(pa.int64())).as_py()
        counters["enriched"] += chunk.num_rows - errors
        counters["errors"] += errors
        counters["input_tokens"] += pc.sum(chunk["input_tokens"]).as_py() or 0
        counters["output_tokens"] += pc.sum(chunk["output_tokens"]).as_py() or 0
        on_progress(chunk.num_rows)
    return counters


def _chunks(ds, size: int) -> Iterator[pa.Table]:
    for batch in ds.iter_batches(batch_size=size, batch_format="pyarrow"):
        yield pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
                 configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
