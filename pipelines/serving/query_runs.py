"""`sira query`'s rows in the Delta runs table (one per query: its program and ranked hits, the index version it was
scored on): the query files a run reads, the queries a killed run already committed, each scored batch appended,
and the TREC file written from the table."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from sira.pipelines.storage.delta_io import read_table, table_exists, write_table
from sira.core import tables
from sira.core.datasets import iter_lines


def read_queries(spec: str) -> dict[str, str]:
    path = Path(spec)
    if path.is_dir() and DeltaTable.is_deltatable(spec):
        t = read_table(spec, columns=["qid", "query"])
        return dict(zip(t["qid"].to_pylist(), t["query"].to_pylist()))
    if not path.exists():
        raise FileNotFoundError(f"queries {spec!r} not found (expected .jsonl[.gz], .tsv or a Delta table)")
    out: dict[str, str] = {}
    for n, line in iter_lines(path):
        text = line.decode("utf-8")
        if path.name.endswith((".tsv", ".tsv.gz")):
            qid, sep, query = text.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{n}: expected qid<TAB>text")
        else:
            obj = json.loads(text)
            qid, query = str(obj.get("_id", obj.get("qid", ""))), obj.get("text", obj.get("query", ""))
        if not qid or not query.strip():
            raise ValueError(f"{path}:{n}: query without id or text")
        out[qid] = query
    return out


def resumed(runs_uri: str, run_id: str, index_version: int | None) -> tuple[set[str], int | None]:
    """The queries of run `run_id` already in the runs table, and the index version the run scores on: a resumed
    run finishes on the index its committed queries were scored on (a version published in between, the nightly
    build, would otherwise mix two indexes in one run)."""
    if not table_exists(runs_uri):
        return set(), index_version
    t = read_table(runs_uri, columns=["run_id", "qid", "index_version"])
    t = t.filter(pc.equal(t["run_id"], run_id))
    scored_on = set(t["index_version"].to_pylist())
    if index_version is None and scored_on:
        index_version = max(scored_on)
    elif scored_on - {index_version}:
        on = ", ".join(f"v{v}" for v in sorted(scored_on))
        raise ValueError(f"run {run_id!r} has queries scored on index {on}, not v{index_version}: "
                         "resume it on its own version or start a new run id")
    return set(t["qid"].to_pylist()), index_version


def write_trec(runs_uri: str, run_id: str, out: Path) -> None:
    """The run's TREC file, from every query of it in the runs table (those scored before a resume included)."""
    from sira.core.metrics import write_trec_run

    rows = read_table(runs_uri, columns=["run_id", "qid", "doc_ids", "scores"]) if table_exists(runs_uri) else \
        pa.Table.from_pylist([], schema=tables.RUNS_SCHEMA)
    rows = rows.filter(pc.equal(rows["run_id"], run_id))
    run_hits = {q: dict(zip(ids, scores)) for q, ids, scores in
                zip(rows["qid"].to_pylist(), rows["doc_ids"].to_pylist(), rows["scores"].to_pylist())}
    write_trec_run({q: run_hits[q] for q in sorted(run_hits)}, out, f"sira-{run_id}")


def commit_runs(uri, run_id, qids, texts, programs, results: pa.Table, index_version) -> None:
    from sira.core.retriever import hits_by_query

    now = datetime.now(timezone.utc)
    hits = hits_by_query(results)  # each query's hits best first
    rows = pa.Table.from_pylist([
        {"run_id": run_id, "qid": q, "query": texts[q], "program": p.model_dump_json(),
         "doc_ids": list(hits.get(q, {})), "scores": list(hits.get(q, {}).values()), "index_version": index_version,
         "created_at": now}
        for q, p in zip(qids, programs)], schema=tables.RUNS_SCHEMA)
    # An append, not a MERGE: a MERGE reads the table it merges into, so each commit cost more as the run grew. The
    # rows are new by construction: the queries of this run not in the table yet (`resumed`), each batch once.
    write_table(uri, rows)
