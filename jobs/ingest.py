"""`sira ingest`: validate a corpus source and write the Delta `docs` table (bad records -> `rejected`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime, timezone
from typing import Iterator

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from jobs.progress import progress_bar
from pipelines.delta_io import write_table
from sira_core import tables
from sira_core.datasets import RecordError, parse_record, resolve_corpus


class IngestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="beir:NAME, a BEIR folder, a .jsonl[.gz] or a .parquet file")
    warehouse: str
    batch_size: int = Field(20_000, gt=0)


def content_hash(title: str, text: str) -> str:
    return hashlib.blake2b(f"{title}\x1f{text}".encode("utf-8"), digest_size=16).hexdigest()


def run(cfg: IngestConfig) -> dict:
    source = resolve_corpus(cfg.source)
    now = datetime.now(timezone.utc)
    seen: dict[str, int] = {}
    rejected: list[dict] = []
    counts = Counter()

    def reject(raw, doc_id, reason):
        payload = raw.payload.decode("utf-8", "replace") if isinstance(raw.payload, bytes) else repr(raw.payload)
        rejected.append(
            {"source": raw.source, "record": raw.record, "doc_id": doc_id, "reason": reason,
             "raw": payload[: tables.RAW_KEEP_CHARS], "rejected_at": now}
        )

    def batches() -> Iterator[pa.RecordBatch]:
        rows = {name: [] for name in tables.DOCS_SCHEMA.names}
        with progress_bar(f"ingest {source.name}", total=None, unit="records") as advance:
            for raw in source.records():
                counts["read"] += 1
                advance(1)
                try:
                    doc_id, title, text = parse_record(raw)
                except RecordError as exc:
                    reject(raw, None, str(exc))
                    continue
                if doc_id in seen:
                    reject(raw, doc_id, f"duplicate id {doc_id!r} (first seen at record {seen[doc_id]})")
                    continue
                seen[doc_id] = raw.record
                for name, value in zip(rows, (doc_id, title, text, content_hash(title, text), now)):
                    rows[name].append(value)
                if len(rows["doc_id"]) >= cfg.batch_size:
                    yield pa.RecordBatch.from_pydict(rows, schema=tables.DOCS_SCHEMA)
                    rows = {name: [] for name in rows}
            if rows["doc_id"]:
                yield pa.RecordBatch.from_pydict(rows, schema=tables.DOCS_SCHEMA)

    reader = pa.RecordBatchReader.from_batches(tables.DOCS_SCHEMA, batches())
    # A full snapshot replaces the table in one commit: a killed ingest leaves the previous version intact.
    docs_version = write_table(tables.table_uri(cfg.warehouse, tables.DOCS), reader, mode="overwrite")
    write_table(tables.table_uri(cfg.warehouse, tables.REJECTED),
                pa.Table.from_pylist(rejected, schema=tables.REJECTED_SCHEMA), mode="overwrite")
    reasons = Counter(r["reason"].split(" (")[0].split(":")[0] for r in rejected)
    return {
        "source": cfg.source,
        "read": counts["read"],
        "kept": len(seen),
        "rejected": len(rejected),
        "rejected_by_reason": dict(reasons),
        "docs_table_version": docs_version,
    }
