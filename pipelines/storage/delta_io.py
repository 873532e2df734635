"""Delta tables through delta-rs: the JVM-free side of the warehouse (ingest writes, searcher reads)."""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError


def table_exists(uri: str) -> bool:
    return DeltaTable.is_deltatable(uri)


def table_version(uri: str) -> int | None:
    """Latest committed version, or None when there is no table."""
    try:
        return DeltaTable(uri).version()
    except TableNotFoundError:
        return None


def table_id(uri: str, version: int | None = None) -> str:
    """The table's id (Delta metadata): the same for every version of the table, new when it is created again."""
    table = _snapshot(uri, version) if version is not None else _open(uri, None)
    with _OPENING:
        return table.metadata().id


def read_table(
    uri: str,
    version: int | None = None,
    filters: Sequence[tuple] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Read one version of a table; `filters` are AND-ed tuples like ("shard", "=", 3) or ("segment", "in", [1, 4]).
    Partition columns in `filters` prune whole files."""
    expr = None
    for col, op, value in filters or ():
        if op == "=":
            term = pc.field(col) == value
        elif op == "in":
            term = pc.field(col).isin(list(value))
        else:
            raise ValueError(f"unsupported filter operator {op!r}")
        expr = term if expr is None else expr & term
    return _dataset(uri, version).to_table(columns=list(columns) if columns else None, filter=expr)


_OPENING = threading.Lock()


def _open(uri: str, version: int | None) -> DeltaTable:
    try:
        return DeltaTable(uri, version=version)
    except TableNotFoundError:
        raise FileNotFoundError(f"no Delta table at {uri}") from None


def _snapshot(uri: str, version: int) -> DeltaTable:
    """A committed version of a table, opened once per process: a loader that reads one table version per shard
    and segment replays its log once. Keyed by the version's commit file as well (size and time), so a table
    created again at the same place is opened again."""
    key = _commit_key(uri, version)
    return _open(uri, version) if key is None else _snapshot_of(uri, version, *key)


def _commit_key(uri: str, version: int) -> tuple[int, int] | None:
    """(size, mtime) of a version's commit file; None when the log was cleaned up past a checkpoint (nothing to
    key on)."""
    fs, path = _filesystem(uri)
    info = fs.get_file_info(f"{path.rstrip('/')}/_delta_log/{version:020d}.json")
    return None if info.type == pafs.FileType.NotFound else (info.size, info.mtime_ns)


@lru_cache(maxsize=16)
def _snapshot_of(uri: str, version: int, size: int, mtime_ns: int) -> DeltaTable:
    return _open(uri, version)


def _dataset(uri: str, version: int | None):
    """The files of one version of a table as a pyarrow dataset; a committed version's is made once per process (a
    loader reads 2 x segments x shards partitions of one version, and listing a table of thousands of files with
    their partition values costs tens of milliseconds each time)."""
    key = _commit_key(uri, version) if version is not None else None
    return _list_files(_open(uri, version)) if key is None else _dataset_of(uri, version, *key)


@lru_cache(maxsize=16)
def _dataset_of(uri: str, version: int, size: int, mtime_ns: int):
    return _list_files(_snapshot_of(uri, version, size, mtime_ns))


def _list_files(table: DeltaTable):
    with _OPENING:  # a DeltaTable is one Rust object: one thread at a time lists its files
        return table.to_pyarrow_dataset()


# Files of at most this size: delta-rs buffers a file's rows before writing it, so this bounds a streamed write's
# memory (the default buffered a 200,000-document corpus, 1 GB, whole).
TARGET_FILE_BYTES = 32 << 20


def write_table(uri: str, data, mode: str = "append", partition_by: Sequence[str] | None = None) -> int:
    """Write in one commit (the data's own Arrow schema); returns the new table version."""
    write_deltalake(uri, data, mode=mode, partition_by=list(partition_by) if partition_by else None,
                    target_file_size=TARGET_FILE_BYTES)
    return DeltaTable(uri).version()


def _filesystem(uri: str):
    """(pyarrow filesystem, root path) of a table URI or local path."""
    return pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))


def write_stream(uri: str, batches: pa.RecordBatchReader, mode: str = "overwrite", file_rows: int = 100_000,
                 configuration: dict[str, str] | None = None) -> int:
    """Write a stream of any length in one commit with memory bounded by one row group: the files are written here
    with pyarrow, `file_rows` rows each, then added to the table in a single transaction (delta-rs's own writer
    holds a large part of the stream in memory). `configuration`: table properties of a table created here.
    Returns the new table version."""
    import json
    import time
    import uuid

    import pyarrow.parquet as pq
    from deltalake.schema import Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    fs, root = _filesystem(uri)
    fs.create_dir(root, recursive=True)
    actions: list = []
    writer, path, rows = None, "", 0

    def close() -> None:
        nonlocal writer, rows
        if writer is not None:
            writer.close()
            actions.append(AddAction(path, fs.get_file_info(f"{root}/{path}").size, {}, int(time.time() * 1000), True,
                                     json.dumps({"numRecords": rows})))
            writer, rows = None, 0

    for batch in batches:
        if writer is None:
            path = f"part-{uuid.uuid4()}.zstd.parquet"
            writer = pq.ParquetWriter(fs.open_output_stream(f"{root}/{path}"), batches.schema, compression="zstd")
        writer.write_batch(batch)
        rows += batch.num_rows
        if rows >= file_rows:
            close()
    close()
    schema = Schema.from_arrow(batches.schema)
    if table_exists(uri):
        DeltaTable(uri).create_write_transaction(actions, mode, schema)
    else:
        create_table_with_add_actions(uri, schema, actions, mode, configuration=configuration)
    return DeltaTable(uri).version()


# Delta's change data feed: MERGEs into a table with this property also record each changed row (pre- and
# post-image), so a reader can take what changed between two versions without comparing them.
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def records_changes(table: DeltaTable) -> bool:
    """Whether the table (as loaded) has the change data feed on."""
    return table.metadata().configuration.get(CHANGE_DATA_FEED, "false").lower() == "true"


def row_count(uri: str, version: int | None = None, partition: tuple[str, str] | None = None) -> int | None:
    """Rows of a table version (of one partition, (column, value)) from its log's file statistics, without reading
    a data file; None when a file lacks the statistic or the table may have deleted rows in place (deletion
    vectors)."""
    table = DeltaTable(uri, version=version)
    if "deletionVectors" in (table.protocol().reader_features or []):
        return None
    adds = pa.table(table.get_add_actions(flatten=True))
    if partition is not None:
        column, value = partition
        adds = adds.filter(pc.equal(adds.column(f"partition.{column}"), value))
    counts = adds.column("num_records")
    return None if counts.null_count else int(pc.sum(counts).as_py() or 0)


def has_change_data(uri: str, since: int, until: int) -> bool:
    """Whether every commit after version `since` up to `until` is a MERGE recorded in the change data feed, or the
    commit that turned the feed on (no data changes): then the feed holds exactly what changed between the two
    versions. A rewrite, a restore or another property change in between, or a feed not enabled, is False."""
    import json

    table = DeltaTable(uri, version=until)
    if not records_changes(table):
        return False

    def recorded(commit: dict | None) -> bool:
        if commit is None:
            return False
        if commit.get("operation") == "MERGE":
            return True
        properties = (commit.get("operationParameters") or {}).get("properties") if \
            commit.get("operation") == "SET TBLPROPERTIES" else None
        return properties is not None and str(json.loads(properties).get(CHANGE_DATA_FEED)).lower() == "true"

    commits = {h["version"]: h for h in table.history(limit=until - since) if "version" in h}
    return all(recorded(commits.get(v)) for v in range(since + 1, until + 1))


def merge_rows(uri: str, rows: pa.Table, key: Sequence[str], replace_when: str | None = None) -> None:
    """Upsert on `key` in one commit: new keys are inserted; an existing row is replaced only when
    `replace_when` (a predicate on target `t`) holds. Creates the table on first use."""
    if not table_exists(uri):
        write_deltalake(uri, rows, mode="append")
        return
    merger = DeltaTable(uri).merge(rows, predicate=" AND ".join(f"t.{k} = s.{k}" for k in key),
                                   source_alias="s", target_alias="t",
                                   merge_schema=True)  # tables written before a column was added gain it
    if replace_when is not None:
        merger = merger.when_matched_update_all(predicate=replace_when)
    merger.when_not_matched_insert_all().execute()


def changed_data_files(uri: str, since: int, until: int) -> list[str] | None:
    """The data files (paths under the table root) that the commits after version `since` up to `until` added or
    removed with a change of data: their rows are every row that came or went in between (a compaction, whose
    rewrites change no data, adds none). None when a commit's log entry is gone (log retention), so that the
    changes cannot be known this way."""
    import json
    from urllib.parse import unquote

    fs, root = _filesystem(uri)
    files: set[str] = set()
    for version in range(since + 1, until + 1):
        try:
            with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as fh:
                lines = fh.read().decode("utf-8").splitlines()
        except (FileNotFoundError, OSError):
            return None
        for line in lines:
            action = json.loads(line) if line.strip() else {}
            for kind in ("add", "remove"):
                entry = action.get(kind)
                if entry is not None and entry.get("dataChange", True):
                    files.add(unquote(entry["path"]))
    return sorted(files)


def data_files(uri: str, version: int | None = None) -> list[str]:
    """The data files of a table version, as paths under the table root: every row of the version is a row of
    one of them, read whole (a table whose deletion vectors hide rows inside files is refused: ValueError)."""
    table = DeltaTable(uri, version=version)
    if "deletionVectors" in (table.protocol().reader_features or []):
        raise ValueError(f"{uri}: the table has deletion vectors (rows deleted inside data files), which the file-by-"
                         "file readers do not apply; rewrite it without them (ALTER TABLE ... SET TBLPROPERTIES "
                         "('delta.enableDeletionVectors' = false) and REORG TABLE ... APPLY (PURGE))")
    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return sorted(paths)


def open_data_file(uri: str, path: str):
    """A pyarrow ParquetFile of the table's data file `path` (as `data_files` names it)."""
    import pyarrow.parquet as pq

    fs, root = _filesystem(uri)
    return pq.ParquetFile(fs.open_input_file(f"{root}/{path}"))


def read_data_files(uri: str, paths: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """`columns` of the table's data files `paths` (as `changed_data_files` names them), removed ones included while
    they are still on disk (FileNotFoundError once vacuumed)."""
    import pyarrow.parquet as pq

    fs, root = _filesystem(uri)
    parts = [pq.read_table(f"{root}/{p}", columns=list(columns), filesystem=fs) for p in paths]
    return pa.concat_tables(parts) if parts else pa.table({c: pa.array([], pa.string()) for c in columns})
