"""Index version retention: unpublish and delete index versions older than the retention window.

A version is unpublished first (its corpus_stats row goes, so no new reader finds it), then its rows go from
the per-version tables, then VACUUM removes files older than the window that the latest table versions no
longer reference. A reader that had already resolved the version keeps reading it: the manifest pins the table
versions it reads (Delta time travel), and their files survive until the window has passed. The newest version
of each kind (preset x enriched) is always kept, however old, so a warehouse is never left without an index.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from deltalake import DeltaTable

from sira.pipelines.storage.delta_io import table_exists
from sira.pipelines.index.catalog import published_versions
from sira.core import tables



def _utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=timezone.utc)


def expired_versions(rows: list[dict], keep_days: float, now: datetime) -> list[int]:
    """Versions built before now - keep_days, except the newest of each (preset, enriched) kind."""
    newest: dict[tuple, int] = {}
    for r in rows:
        kind = (r["preset"], bool(r["enriched"]))
        newest[kind] = max(newest.get(kind, r["index_version"]), r["index_version"])
    cutoff = now - timedelta(days=keep_days)
    return sorted(r["index_version"] for r in rows
                  if r["index_version"] not in newest.values() and _utc(r["built_at"]) < cutoff)


def expire_versions(warehouse: str, keep_days: float, now: datetime | None = None, vacuum: bool = True) -> dict:
    """Delete expired index versions (see the module doc); returns which went and which stay."""
    now = now or datetime.now(timezone.utc)
    rows = published_versions(warehouse)
    expired = expired_versions(rows, keep_days, now)
    kept = [r["index_version"] for r in rows if r["index_version"] not in expired]
    if expired:
        predicate = f"index_version IN ({', '.join(str(v) for v in expired)})"
        DeltaTable(tables.table_uri(warehouse, tables.CORPUS_STATS)).delete(predicate)  # unpublish first
        # term_stats rows go with the last version that sums them (an expired base of a kept incremental version
        # stays until that one goes too).
        summed = lambda rs: {v for r in rs for v in tables.term_stats_versions_of(r)}  # noqa: E731
        stats_gone = summed(r for r in rows if r["index_version"] in expired) - summed(
            r for r in rows if r["index_version"] not in expired)
        for name in (*tables.PER_VERSION_TABLES, *tables.LAYOUT_1_TABLES):
            uri = tables.table_uri(warehouse, name)
            gone = sorted(stats_gone) if name == tables.TERM_STATS else expired
            if table_exists(uri) and gone:
                DeltaTable(uri).delete(f"index_version IN ({', '.join(str(v) for v in gone)})")
        # A segment goes with the last version that lists it (never one a running build has not published yet).
        listed = lambda rs: {s for r in rs for s in (r.get("segments") or [])}  # noqa: E731
        orphaned = listed(r for r in rows if r["index_version"] in expired) - listed(
            r for r in rows if r["index_version"] not in expired)
        if orphaned:
            for name in tables.PER_SEGMENT_TABLES:
                uri = tables.table_uri(warehouse, name)
                if table_exists(uri):
                    DeltaTable(uri).delete(f"segment IN ({', '.join(str(s) for s in sorted(orphaned))})")
    vacuumed = 0
    if vacuum:
        hours = max(1, math.ceil(keep_days * 24))  # never 0: a reader resolving a version right now needs its files
        for name in (tables.CORPUS_STATS, *tables.PER_VERSION_TABLES, *tables.PER_SEGMENT_TABLES,
                     *tables.LAYOUT_1_TABLES):
            uri = tables.table_uri(warehouse, name)
            if table_exists(uri):
                vacuumed += len(DeltaTable(uri).vacuum(retention_hours=hours, dry_run=False,
                                                       enforce_retention_duration=False))
    return {"expired_versions": expired, "kept_versions": kept, "vacuumed_files": vacuumed}
