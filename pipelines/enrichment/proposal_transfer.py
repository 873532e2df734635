"""Move LLM proposals between warehouses as Parquet: enrich where the GPUs are, index where the data lives.

An export is a plain Parquet file with the proposal table's own schema (anyone can read it); an import merges it
on the table's key, so importing twice, or importing rows the warehouse already has, changes nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sira.pipelines.storage.delta_io import read_table, table_exists
from sira.pipelines.enrichment.ray_enrich import PROPOSAL_TABLES, commit
from sira.core import tables


def export_proposals(warehouse: str, path: str | Path, table: str = tables.ENRICHMENT, model: str | None = None,
                     prompt_version: str | None = None, include_errors: bool = False) -> dict:
    """Write the rows of `table` (optionally one model / prompt version) to one Parquet file."""
    schema, key = _proposal_table(table)
    uri = tables.table_uri(warehouse, table)
    if not table_exists(uri):
        raise FileNotFoundError(f"no {table} table in {warehouse}: nothing to export")
    rows = read_table(uri).select(schema.names).cast(schema)
    for column, value in (("model", model), ("prompt_version", prompt_version)):
        if value is not None:
            rows = rows.filter(pc.equal(rows[column], value))
    errors = rows.num_rows - pc.sum(pc.is_null(rows["error"]).cast(pa.int64())).as_py() if rows.num_rows else 0
    if not include_errors:
        rows = rows.filter(pc.is_null(rows["error"]))  # an errored row would only be retried by the importer
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows.sort_by([(k, "ascending") for k in key]), path, compression="zstd")
    return {"table": table, "path": str(path), "rows": rows.num_rows, "errors_left_out": 0 if include_errors else errors,
            "versions": _versions(rows)}


def import_proposals(warehouse: str, path: str | Path, table: str = tables.ENRICHMENT) -> dict:
    """Merge a Parquet export into `table`. Enrichment rows whose (doc_id, content_hash) is not a current document
    are counted as stale and left out: they describe text the warehouse no longer holds."""
    schema, key = _proposal_table(table)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such Parquet file or folder")
    rows = pq.read_table(path)
    missing = [n for n in schema.names if n not in rows.column_names]
    if missing:
        raise ValueError(f"{path}: not a {table} export: columns {missing} are missing "
                         f"(expected {schema.names})")
    try:
        rows = rows.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
        raise ValueError(f"{path}: a column does not have the {table} type: {exc}") from None
    read = rows.num_rows
    if rows.num_rows:
        duplicated = rows.group_by(list(key)).aggregate([([], "count_all")])
        duplicated = duplicated.filter(pc.greater(duplicated["count_all"], 1))
        if duplicated.num_rows:
            first = {k: duplicated[k][0].as_py() for k in key}
            raise ValueError(f"{path}: {duplicated.num_rows} keys occur more than once, first {first}")
    stale = 0
    if table == tables.ENRICHMENT and rows.num_rows:
        docs = read_table(tables.table_uri(warehouse, tables.DOCS), columns=["doc_id", "content_hash"])
        current = pc.is_in(_pair(rows), value_set=_pair(docs))  # (Arrow joins cannot carry list columns)
        stale, rows = rows.num_rows - pc.sum(current.cast(pa.int64())).as_py(), rows.filter(current)
    present = _keys(tables.table_uri(warehouse, table), key)
    inserted = sum(k not in present for k in zip(*(rows[k].to_pylist() for k in key)))
    if rows.num_rows:
        commit(warehouse, rows, table)
    return {"table": table, "path": str(path), "rows": read, "stale": stale, "inserted": inserted,
            "already_present": rows.num_rows - inserted, "versions": _versions(rows)}


def _proposal_table(table: str):
    if table not in PROPOSAL_TABLES:
        raise ValueError(f"unknown proposal table {table!r}; one of {sorted(PROPOSAL_TABLES)}")
    return PROPOSAL_TABLES[table]


def _pair(rows: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(rows["doc_id"], rows["content_hash"], "\x1f")


def _keys(uri: str, key) -> set[tuple]:
    if not table_exists(uri):
        return set()
    existing = read_table(uri, columns=list(key))
    return set(zip(*(existing[k].to_pylist() for k in key)))


def _versions(rows: pa.Table) -> dict[str, int]:
    """Rows per model / prompt version: what an export holds, at a glance."""
    if not rows.num_rows:
        return {}
    counts = rows.group_by(["model", "prompt_version"]).aggregate([([], "count_all")])
    return {f"{m} / {v}": n for m, v, n in zip(counts["model"].to_pylist(), counts["prompt_version"].to_pylist(),
                                               counts["count_all"].to_pylist())}
