"""What a warehouse records about itself at ingest (the `warehouse_info` table), read back by later jobs."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from sira.pipelines.storage.delta_io import merge_rows, read_table, table_exists
from sira.core import tables
from sira.core.enrichment import task_for_dataset

GENERIC_TASK = "generic"


def read_info(warehouse: str) -> dict[str, str]:
    uri = tables.table_uri(warehouse, tables.WAREHOUSE_INFO)
    if not table_exists(uri):
        return {}
    rows = read_table(uri, columns=["key", "value"]).to_pylist()
    return {r["key"]: r["value"] for r in rows}


def record(warehouse: str, values: dict[str, str], source: str) -> None:
    now = datetime.now(timezone.utc)
    rows = pa.Table.from_pylist([{"key": k, "value": v, "source": source, "updated_at": now} for k, v in values.items()],
                                schema=tables.WAREHOUSE_INFO_SCHEMA)
    merge_rows(tables.table_uri(warehouse, tables.WAREHOUSE_INFO), rows, key=["key"], replace_when="true")


def task_at_ingest(warehouse: str, explicit: str | None, dataset: str | None, source: str) -> str:
    """Record the warehouse's prompt task: `explicit` (--task), else the dataset's (a BEIR source names one), else
    keep what an earlier ingest recorded, else generic. Returns the task now recorded. (`explicit` comes validated
    by IngestConfig.)"""
    task = explicit or (task_for_dataset(dataset) if dataset else None)
    if task is None:
        recorded = read_info(warehouse).get("task")
        if recorded is not None:
            return recorded
        task = GENERIC_TASK
    record(warehouse, {"task": task}, source)
    return task


def warehouse_task(warehouse: str, explicit: str | None = None) -> str:
    """The prompt task of a job on this warehouse: `explicit` (--task), else the one recorded at ingest, else
    generic (a warehouse ingested before tasks were recorded; ingest again or pass --task)."""
    if explicit is not None:
        return explicit
    return read_info(warehouse).get("task", GENERIC_TASK)
