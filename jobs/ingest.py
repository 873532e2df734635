"""`sira ingest`: validate a corpus source and write the Delta `docs` table (bad records -> `rejected`).

Two modes: `replace` writes the snapshot as the whole table; `merge` (what `sira nightly` runs) MERGEs it into
the existing table by doc id, so inserts, updates (a new content hash) and deletes (ids missing from the
snapshot) land in one commit and unchanged documents keep their row, their `ingested_at` and their cached
enrichment.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from datetime import datetime, timezone
from typing import Iterator, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from jobs.progress import progress_bar
from pipelines.delta_io import table_exists, table_version, write_table
from sira_core import tables
from sira_core.datasets import RecordError, parse_record, resolve_corpus


class IngestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="beir:NAME, a BEIR folder, a .jsonl[.gz] or a .parquet file")
    warehouse: str
    batch_size: int = Field(20_000, gt=0)
    mode: Literal["replace", "merge"] = Field(
        "replace", description="replace: the snapshot becomes the table; merge: insert / update / delete by doc id "
                               "and content hash against the current table")
    max_delete_fraction: float = Field(
        0.5, ge=0, le=1, description="merge: refuse (and roll back) a snapshot that deletes more than this share of "
                                     "the current docs: a truncated or wrong file must not empty the corpus; 1: no limit")


def reason_kind(reason: str) -> str:
    """A reject reason without its particulars ("duplicate id '7' (first seen ...)" -> "duplicate id"), for counts."""
    return re.sub(r" ('[^']*'|\d+)$", "", reason.split(" (")[0].split(":")[0])


def content_hash(title: str, text: str) -> str:
    return hashlib.blake2b(f"{title}\x1f{text}".encode("utf-8"), digest_size=16).hexdigest()


class _Snapshot:
    """The source's valid records as Arrow batches (read lazily, once), with the rejects and counts it saw."""

    def __init__(self, cfg: IngestConfig):
        self.cfg = cfg
        self.source = resolve_corpus(cfg.source)
        self.now = datetime.now(timezone.utc)
        self.seen: dict[str, int] = {}
        self.rejected: list[dict] = []
        self.read = 0

    def _reject(self, raw, doc_id, reason) -> None:
        payload = raw.payload.decode("utf-8", "replace") if isinstance(raw.payload, bytes) else repr(raw.payload)
        self.rejected.append({"source": raw.source, "record": raw.record, "doc_id": doc_id, "reason": reason,
                              "raw": payload[: tables.RAW_KEEP_CHARS], "rejected_at": self.now})

    def batches(self) -> Iterator[pa.RecordBatch]:
        rows = {name: [] for name in tables.DOCS_SCHEMA.names}
        with progress_bar(f"ingest {self.source.name}", total=None, unit="records") as advance:
            for raw in self.source.records():
                self.read += 1
                advance(1)
                try:
                    doc_id, title, text = parse_record(raw)
                except RecordError as exc:
                    self._reject(raw, None, str(exc))
                    continue
                if doc_id in self.seen:
                    self._reject(raw, doc_id, f"duplicate id {doc_id!r} (first seen at record {self.seen[doc_id]})")
                    continue
                self.seen[doc_id] = raw.record
                for name, value in zip(rows, (doc_id, title, text, content_hash(title, text), self.now)):
                    rows[name].append(value)
                if len(rows["doc_id"]) >= self.cfg.batch_size:
                    yield pa.RecordBatch.from_pydict(rows, schema=tables.DOCS_SCHEMA)
                    rows = {name: [] for name in rows}
            if rows["doc_id"]:
                yield pa.RecordBatch.from_pydict(rows, schema=tables.DOCS_SCHEMA)

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(tables.DOCS_SCHEMA, self.batches())


class SnapshotRefused(ValueError):
    """A merge snapshot would delete too much of the corpus; the docs table was left as it was."""


def _merge(uri: str, snapshot: _Snapshot, max_delete_fraction: float) -> dict:
    """MERGE the snapshot into the docs table in one commit; counts inserted / updated / deleted / unchanged."""
    from deltalake import DeltaTable

    target = DeltaTable(uri)
    version, current = target.version(), target.to_pyarrow_dataset().count_rows()
    metrics = (
        target
        .merge(snapshot.reader(), predicate="t.doc_id = s.doc_id", source_alias="s", target_alias="t")
        .when_matched_update_all(predicate="t.content_hash <> s.content_hash")
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete()
        .execute()
    )
    inserted, updated, deleted = (metrics[f"num_target_rows_{k}"] for k in ("inserted", "updated", "deleted"))
    if deleted > max_delete_fraction * current:
        # The snapshot's size is known only once it has streamed through the MERGE: undo that one commit.
        DeltaTable(uri).restore(version)
        raise SnapshotRefused(
            f"{snapshot.cfg.source}: this snapshot would delete {deleted} of the {current} documents (more than "
            f"{max_delete_fraction:.0%}; it holds {len(snapshot.seen)} valid records, {len(snapshot.rejected)} "
            "rejected); the docs table is unchanged. Check the file, or raise --max-delete-fraction if intended")
    return {"inserted": inserted, "updated": updated, "deleted": deleted,
            "unchanged": len(snapshot.seen) - inserted - updated}


def run(cfg: IngestConfig) -> dict:
    snapshot = _Snapshot(cfg)
    docs_uri = tables.table_uri(cfg.warehouse, tables.DOCS)
    before = table_version(docs_uri)
    if cfg.mode == "merge" and table_exists(docs_uri):
        changes = _merge(docs_uri, snapshot, cfg.max_delete_fraction)
    else:
        # A full snapshot replaces the table in one commit: a killed ingest leaves the previous version intact.
        write_table(docs_uri, snapshot.reader(), mode="overwrite")
        changes = {"inserted": len(snapshot.seen), "updated": 0, "deleted": 0, "unchanged": 0} \
            if cfg.mode == "merge" else None
    # Replace: the rejects of this snapshot replace the last ones. Merge (nightly): appended, so every night's
    # rejects stay inspectable by `rejected_at`.
    rejected_uri = tables.table_uri(cfg.warehouse, tables.REJECTED)
    write_table(rejected_uri, pa.Table.from_pylist(snapshot.rejected, schema=tables.REJECTED_SCHEMA),
                mode="append" if cfg.mode == "merge" and table_exists(rejected_uri) else "overwrite")
    reasons = Counter(reason_kind(r["reason"]) for r in snapshot.rejected)
    summary = {
        "source": cfg.source,
        "read": snapshot.read,
        "kept": len(snapshot.seen),
        "rejected": len(snapshot.rejected),
        "rejected_by_reason": dict(reasons),
        "docs_table_version": table_version(docs_uri),
        "previous_docs_table_version": before,
    }
    if changes is not None:
        summary["changes"] = changes
    return summary
