"""The ingest dataflow (`sira ingest`): validate a corpus source and write the Delta `docs` table (bad records ->
`rejected`).

Two modes: `replace` writes the snapshot as the whole table; `merge` (what `sira nightly` runs) MERGEs it into
the existing table by doc id, so inserts, updates (a new content hash) and deletes (ids missing from the
snapshot) land in one commit and unchanged documents keep their row, their `ingested_at` and their cached
enrichment. The table records Delta's change data feed, so that the next index build reads the night's changes
from it instead of comparing the whole table with the index.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sira.pipelines.storage.delta_io import CHANGE_DATA_FEED, records_changes, table_exists, table_version, write_stream
from sira.pipelines.storage.warehouse_info import task_at_ingest
from sira.core import tables
from sira.core.datasets import RawRecord, RecordError, parse_batch, parse_record, resolve_corpus
from sira.core.enrichment import check_task


# What a job passes for progress display: (description, total, unit) -> a context yielding `advance(n)`.
Progress = Callable[[str, int | None, str], ContextManager[Callable[[int], None]]]


INGEST_BATCH_ROWS = 20_000  # records parsed and validated at once


class IngestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="beir:NAME, a BEIR folder, a .jsonl[.gz] or a .parquet file")
    warehouse: str
    batch_size: int = Field(INGEST_BATCH_ROWS, gt=0, description="records per parsed and validated batch")
    mode: Literal["replace", "merge"] = Field(
        "replace", description="replace: the snapshot becomes the table; merge: insert / update / delete by doc id "
                               "and content hash against the current table")
    max_delete_fraction: float = Field(
        0.5, ge=0, le=1, description="merge: refuse (and roll back) a snapshot that deletes more than this share of "
                                     "the current docs: a truncated or wrong file must not empty the corpus; 1: no limit")
    task: str | None = Field(None, description="the prompt task recorded for this warehouse (enrich, query expansion "
                                               "and serve read it); default: the dataset's when the source is a BEIR "
                                               "dataset, else the one recorded before, else generic")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str | None) -> str | None:
        return None if task is None else check_task(task)


def reason_kind(reason: str) -> str:
    """A reject reason without its particulars ("duplicate id '7' (first seen ...)" -> "duplicate id"), for counts."""
    return re.sub(r" ('[^']*'|\d+)$", "", reason.split(" (")[0].split(":")[0])


def content_hash(title: str, text: str) -> str:
    return hashlib.blake2b(f"{title}\x1f{text}".encode("utf-8"), digest_size=16).hexdigest()


def _blake2b_each(strings: pa.Array) -> list[bytes]:
    """The 16-byte blake2b digest of each value of a string array (no nulls), from its UTF-8 bytes as they lie in
    Arrow's buffer: `content_hash` and the id fingerprints without a Python string per value."""
    strings = strings.cast(pa.string())
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)[strings.offset: strings.offset + len(strings) + 1]
    data = memoryview(strings.buffers()[2] or b"")
    return [hashlib.blake2b(data[a:b], digest_size=16).digest() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


class _DuplicateIds:
    """Which records repeat the id of an earlier valid one, in memory bounded by one bucket, not by the source.

    Each id's 128-bit fingerprint (blake2b, as content_hash: a collision is not a practical concern) and record
    number go to one of BUCKETS files on disk by the fingerprint's first byte; each bucket is then sorted on its
    own. 24 bytes per record on disk; in memory, a bucket: 100 MB at a billion records."""

    BUCKETS = 256
    FLUSH_RECORDS = 65_536
    ROW = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("record", "<i8")])

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._fingerprints = bytearray()
        self._records: list[int] = []

    def add(self, doc_id: str, record: int) -> None:
        self._fingerprints += hashlib.blake2b(doc_id.encode("utf-8"), digest_size=16).digest()
        self._records.append(record)
        if len(self._records) >= self.FLUSH_RECORDS:
            self._flush()

    def add_fingerprints(self, fingerprints: list[bytes], records: np.ndarray) -> None:
        """`add` for many ids at once, given their fingerprints (`_blake2b_each`)."""
        self._fingerprints += b"".join(fingerprints)
        self._records.extend(records.tolist())
        if len(self._records) >= self.FLUSH_RECORDS:
            self._flush()

    def _flush(self) -> None:
        n = len(self._records)
        if not n:
            return
        halves = np.frombuffer(bytes(self._fingerprints), dtype=">u8").reshape(n, 2)
        rows = np.empty(n, self.ROW)
        rows["hi"], rows["lo"], rows["record"] = halves[:, 0], halves[:, 1], self._records
        bucket = (rows["hi"] >> np.uint64(56)).astype(np.intp)
        order = np.argsort(bucket, kind="stable")
        rows, bucket = rows[order], bucket[order]
        bounds = np.searchsorted(bucket, np.arange(self.BUCKETS + 1))
        for b in np.flatnonzero(np.diff(bounds)):
            with open(self.folder / f"{b:03d}.bin", "ab") as fh:
                rows[bounds[b]:bounds[b + 1]].tofile(fh)
        self._fingerprints, self._records = bytearray(), []

    def duplicates(self) -> tuple[np.ndarray, np.ndarray]:
        """(record, record of the id's first occurrence) of every repeat, ascending by record; the files go."""
        self._flush()
        repeats, firsts = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        for path in sorted(self.folder.glob("*.bin")):
            rows = np.fromfile(path, self.ROW)
            path.unlink()
            rows = rows[np.lexsort((rows["record"], rows["lo"], rows["hi"]))]
            starts = np.concatenate([[True], (rows["hi"][1:] != rows["hi"][:-1]) | (rows["lo"][1:] != rows["lo"][:-1])])
            if starts.all():
                continue
            first = rows["record"][np.flatnonzero(starts)][np.cumsum(starts) - 1]
            repeats.append(rows["record"][~starts])
            firsts.append(first[~starts])
        repeats, firsts = np.concatenate(repeats), np.concatenate(firsts)
        order = np.argsort(repeats)
        return repeats[order], firsts[order]


class _Snapshot:
    """The source's valid records as Arrow batches, with the rejects and counts it saw.

    Memory does not grow with the source: the valid records' rows are spooled to an Arrow file in `spool` (a
    MERGE's, only the new or changed ones: `spool_only`) while their ids go through `_DuplicateIds` (on disk), then
    read back in batches less the repeats; rejects are spooled to a Parquet file there too (a source of nothing but
    bad records is as big as a good one). What memory holds per record is 16 bytes per repeated id only; the spool
    needs about the corpus's size on disk (lz4)."""

    def __init__(self, cfg: IngestConfig, spool: Path, progress: Progress):
        self.cfg = cfg
        self.progress = progress
        self.source = resolve_corpus(cfg.source)
        self.now = datetime.now(timezone.utc)
        self._ids = _DuplicateIds(spool / "ids")
        self.rows_path = spool / "valid.arrow"
        self.kept = 0  # valid records less the repeats of an earlier record's id, once the first pass is done
        self.read = 0
        self.valid = 0
        # When set (a MERGE), the first pass meets the records with the docs table in tables of MERGE_BATCH_ROWS and
        # spools only the rows this mask keeps: the new or changed ones, not the corpus's texts.
        self.spool_only: Callable[[pa.Table], pa.Array] | None = None
        self.rejects_path = spool / "rejected.parquet"
        self._rejects = pq.ParquetWriter(self.rejects_path, tables.REJECTED_SCHEMA)
        self._pending: list[dict] = []
        self.rejected = 0
        self.rejected_by_reason: Counter = Counter()

    def _reject(self, raw, doc_id, reason) -> None:
        payload = raw.payload.decode("utf-8", "replace") if isinstance(raw.payload, bytes) else repr(raw.payload)
        self._pending.append({"source": raw.source, "record": raw.record, "doc_id": doc_id, "reason": reason,
                              "raw": payload[: tables.RAW_KEEP_CHARS], "rejected_at": self.now})
        self.rejected += 1
        self.rejected_by_reason[reason_kind(reason)] += 1
        if len(self._pending) >= REJECT_SPOOL_ROWS:
            self._spool()

    def _spool(self) -> None:
        if self._pending:
            self._rejects.write_table(pa.Table.from_pylist(self._pending, schema=tables.REJECTED_SCHEMA))
            self._pending = []

    def rejects(self) -> pa.RecordBatchReader:
        """Every reject, once the records have been read."""
        self._spool()
        self._rejects.close()
        return pq.ParquetFile(self.rejects_path, pre_buffer=False).iter_batches()

    def _spool_valid(self) -> tuple[np.ndarray, np.ndarray]:
        """First pass: reject the invalid records, spool the valid ones' rows (with their record numbers) to an
        Arrow file, and return `_DuplicateIds.duplicates` of their ids."""
        with pa.ipc.new_file(str(self.rows_path), SPOOL_SCHEMA, options=pa.ipc.IpcWriteOptions(compression="lz4")) as out, \
                self.progress(f"ingest {self.source.name}", None, "records") as advance:
            rows = self._counted(self._columnar_rows(advance) if self.source.kind == "parquet"
                                 else self._record_rows(advance))
            if self.spool_only is not None:
                rows = (batch for table in _rebatch(rows, MERGE_BATCH_ROWS)
                        for batch in table.filter(self.spool_only(table)).to_batches())
            for batch in rows:
                out.write_batch(batch)
        return self._ids.duplicates()

    def _counted(self, rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in rows:
            self.valid += batch.num_rows
            yield batch

    def _record_rows(self, advance: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
        """The valid records of a line source, parsed one by one, in batches of the spool's schema."""
        rows: dict[str, list] = {name: [] for name in SPOOL_SCHEMA.names}
        for raw in self.source.records():
            self.read += 1
            advance(1)
            try:
                doc_id, title, text = parse_record(raw)
            except RecordError as exc:
                self._reject(raw, None, str(exc))
                continue
            self._ids.add(doc_id, raw.record)
            for name, value in zip(rows, (doc_id, title, text, content_hash(title, text), self.now, raw.record)):
                rows[name].append(value)
            if len(rows["doc_id"]) >= self.cfg.batch_size:
                yield pa.RecordBatch.from_pydict(rows, schema=SPOOL_SCHEMA)
                rows = {name: [] for name in rows}
        if rows["doc_id"]:
            yield pa.RecordBatch.from_pydict(rows, schema=SPOOL_SCHEMA)

    def _columnar_rows(self, advance: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
        """The valid records of a columnar source, a batch at a time: `parse_batch` vouches for most rows at once,
        `parse_record` sees the others (and names the problem of those it rejects); rows stay in record order, and
        the texts stay in Arrow (hashed from their UTF-8 bytes, never made Python strings)."""
        src = str(self.source.path)
        for first, batch in self.source.batches():
            n = batch.num_rows
            self.read += n
            advance(n)
            ok, ids, titles, texts = parse_batch(batch)
            fast = pa.array(ok)
            ids, titles, texts = ids.filter(fast), titles.filter(fast), texts.filter(fast)
            records = first + np.flatnonzero(ok)
            slow = np.flatnonzero(~ok)
            if len(slow):
                parsed, kept = [], []
                for i, obj in zip(slow, batch.take(pa.array(slow)).to_pylist()):
                    raw = RawRecord(src, first + int(i), obj)
                    try:
                        parsed.append(parse_record(raw))
                    except RecordError as exc:
                        self._reject(raw, None, str(exc))
                        continue
                    kept.append(raw.record)
                if parsed:
                    ids, titles, texts = (pa.concat_arrays([a, pa.array(list(col), pa.string())])
                                          for a, col in zip((ids, titles, texts), zip(*parsed)))
                    records = np.concatenate([records, np.array(kept, dtype=np.int64)])
                    order = pa.array(np.argsort(records, kind="stable"))
                    ids, titles, texts, records = ids.take(order), titles.take(order), texts.take(order), \
                        records[order.to_numpy()]
            self._ids.add_fingerprints(_blake2b_each(ids), records)
            hashes = [d.hex() for d in _blake2b_each(pc.binary_join_element_wise(titles, texts, "\x1f"))]
            yield pa.RecordBatch.from_arrays(
                [ids, titles, texts, pa.array(hashes, pa.string()),
                 pa.array([self.now] * len(ids), SPOOL_SCHEMA.field("ingested_at").type), pa.array(records)],
                schema=SPOOL_SCHEMA)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The valid records' rows, less those that repeat an earlier record's id (rejected, with their raw
        record, from a second read of the source: only when there are any)."""
        repeats, firsts = self._spool_valid()
        self.kept = self.valid - len(repeats)  # every repeat is a valid record's
        with pa.OSFile(str(self.rows_path)) as spooled:  # read, not mapped: the spool's pages are not held
            reader = pa.ipc.open_file(spooled)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                if len(repeats):
                    batch = batch.filter(pa.array(~np.isin(batch.column("record").to_numpy(), repeats)))
                yield batch.select(tables.DOCS_SCHEMA.names).cast(tables.DOCS_SCHEMA)
        self.rows_path.unlink()
        if len(repeats):
            for raw in self.source.records():
                at = np.searchsorted(repeats, raw.record)
                if at < len(repeats) and repeats[at] == raw.record:
                    doc_id = parse_record(raw)[0]
                    self._reject(raw, doc_id, f"duplicate id {doc_id!r} (first seen at record {firsts[at]})")

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(tables.DOCS_SCHEMA, self.batches())


REJECT_SPOOL_ROWS = 10_000
# The valid records' rows between the two passes: the docs table's columns and the record number.
SPOOL_SCHEMA = pa.schema([*tables.DOCS_SCHEMA, pa.field("record", pa.int64())])
# The snapshot's records meet the current table's keys in batches this big (a batch's join builds a hash table of the
# current keys, so bigger batches mean fewer builds).
MERGE_BATCH_ROWS = 200_000


class SnapshotRefused(ValueError):
    """A merge snapshot would delete too much of the corpus; the docs table was left as it was."""


def _merge(uri: str, snapshot: _Snapshot, max_delete_fraction: float, spool: Path) -> dict:
    """MERGE the snapshot into the docs table in one commit; counts inserted / updated / deleted / unchanged.

    The snapshot streams past the table's keys (doc_id, content_hash: the only per-document state held); only
    new or changed documents are spooled to disk and MERGEd, with the ids that left, so the MERGE's source is the
    night's changes, not the corpus."""
    from deltalake import DeltaTable

    target = DeltaTable(uri)
    current = target.to_pyarrow_dataset().to_table(columns=["doc_id", "content_hash"])
    current = current.rename_columns(["doc_id", "current_hash"]).append_column(
        "_row", pa.array(np.arange(current.num_rows, dtype=np.int64)))
    seen = np.zeros(current.num_rows, dtype=bool)

    def meet(table: pa.Table) -> tuple[pa.Table, pa.Array]:
        """The rows' keys joined with the table's (the texts are not copied through the join), each with its
        position in `table`; and whether each joined row is new or changed (a new one has no current hash: its
        comparison is null, which counts as a change here)."""
        keys = table.select(["doc_id", "content_hash"]).append_column(
            "_pos", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        # The batch is the join's build side and the table's keys probe it: Acero hashes the right input, and hashing
        # the table's million keys for each batch cost ten times the probe (2.8 s of a 1M-document night).
        joined = current.join(keys, "doc_id", join_type="right outer")
        return joined, pc.fill_null(pc.not_equal(joined.column("content_hash"), joined.column("current_hash")), True)

    def new_or_changed(table: pa.Table) -> pa.Array:
        # First pass, every valid record: the table's documents it holds are seen (what is left unseen went).
        joined, differs = meet(table)
        seen[pc.drop_null(joined.column("_row")).to_numpy()] = True
        keep = np.zeros(table.num_rows, dtype=bool)
        keep[joined.filter(differs).column("_pos").to_numpy()] = True
        return pa.array(keep)

    snapshot.spool_only = new_or_changed
    changes_path = spool / "changes.parquet"
    schema = pa.schema([f.with_nullable(True) for f in tables.DOCS_SCHEMA] + [pa.field("_op", pa.string())])
    inserted = updated = 0
    with pq.ParquetWriter(changes_path, schema) as changes:
        # Second pass: only the new or changed rows come back (less the repeats of an earlier record's id).
        for batch in _rebatch(snapshot.batches(), MERGE_BATCH_ROWS):
            joined, _ = meet(batch)
            upserts = batch.select(tables.DOCS_SCHEMA.names)
            n_new = pc.sum(pc.is_null(joined.column("_row")).cast(pa.int64())).as_py() or 0
            inserted, updated = inserted + n_new, updated + upserts.num_rows - n_new
            changes.write_table(upserts.append_column("_op", pa.array(["upsert"] * upserts.num_rows)).cast(schema))
        gone = current.filter(pa.array(~seen)).column("doc_id")
        deleted = len(gone)
        if deleted > max_delete_fraction * current.num_rows:
            raise SnapshotRefused(
                f"{snapshot.cfg.source}: this snapshot would delete {deleted} of the {current.num_rows} documents (more "
                f"than {max_delete_fraction:.0%}; it holds {snapshot.kept} valid records, {snapshot.rejected} "
                "rejected); the docs table is unchanged. Check the file, or raise --max-delete-fraction if intended")
        changes.write_table(pa.table({
            **{f.name: pa.nulls(deleted, f.type) for f in tables.DOCS_SCHEMA if f.name != "doc_id"},
            "doc_id": gone, "_op": pa.array(["delete"] * deleted)}).select(schema.names).cast(schema))
    columns = {c: f"s.{c}" for c in tables.DOCS_SCHEMA.names}
    if inserted or updated or deleted:
        if not records_changes(target):
            # A table made before the feed was on: from the next MERGE on, the index build reads what changed there.
            target.alter.set_table_properties({CHANGE_DATA_FEED: "true"})
            target = DeltaTable(uri)
        source = pa.RecordBatchReader.from_batches(schema, pq.ParquetFile(changes_path, pre_buffer=False).iter_batches())
        (target.merge(source, predicate="t.doc_id = s.doc_id",
                      source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s._op = 'delete'")
         .when_matched_update(columns, predicate="s._op = 'upsert'")
         .when_not_matched_insert(columns, predicate="s._op = 'upsert'")
         .execute())
    return {"inserted": inserted, "updated": updated, "deleted": deleted,
            "unchanged": snapshot.kept - inserted - updated}


def _rebatch(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    waiting, count = [], 0
    for batch in batches:
        waiting.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(waiting)
            waiting, count = [], 0
    if waiting:
        yield pa.Table.from_batches(waiting)


def ingest(cfg: IngestConfig, progress: Progress) -> dict:
    """Write the source's snapshot into the warehouse; `progress(description, total, unit)` opens a progress
    display and yields its `advance(n)`."""
    with tempfile.TemporaryDirectory(prefix="sira-ingest-") as spool:
        return _ingest(cfg, Path(spool), progress)


def _ingest(cfg: IngestConfig, spool: Path, progress: Progress) -> dict:
    snapshot = _Snapshot(cfg, spool, progress)
    docs_uri = tables.table_uri(cfg.warehouse, tables.DOCS)
    before = table_version(docs_uri)
    if cfg.mode == "merge" and table_exists(docs_uri):
        changes = _merge(docs_uri, snapshot, cfg.max_delete_fraction, spool)
    else:
        # A full snapshot replaces the table in one commit: a killed ingest leaves the previous version intact.
        write_stream(docs_uri, snapshot.reader(), mode="overwrite", configuration={CHANGE_DATA_FEED: "true"})
        changes = {"inserted": snapshot.kept, "updated": 0, "deleted": 0, "unchanged": 0} \
            if cfg.mode == "merge" else None
    # Replace: the rejects of this snapshot replace the last ones. Merge (nightly): appended, so every night's
    # rejects stay inspectable by `rejected_at`.
    rejected_uri = tables.table_uri(cfg.warehouse, tables.REJECTED)
    write_stream(rejected_uri, pa.RecordBatchReader.from_batches(tables.REJECTED_SCHEMA, snapshot.rejects()),
                 mode="append" if cfg.mode == "merge" and table_exists(rejected_uri) else "overwrite")
    summary = {
        "source": cfg.source,
        "read": snapshot.read,
        "kept": snapshot.kept,
        "rejected": snapshot.rejected,
        "rejected_by_reason": dict(snapshot.rejected_by_reason),
        "docs_table_version": table_version(docs_uri),
        "previous_docs_table_version": before,
    }
    if changes is not None:
        summary["changes"] = changes
    dataset = snapshot.source.name if snapshot.source.kind == "beir" else None
    summary["task"] = task_at_ingest(cfg.warehouse, cfg.task, dataset, cfg.source)
    return summary
