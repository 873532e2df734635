"""The catalog of published index versions: the rows of `corpus_stats`, read without a JVM (a version is
published when its row lands, sira.pipelines.index.build.publish)."""

from __future__ import annotations

from sira.core import tables
from sira.pipelines.storage.delta_io import read_table, table_exists


class IndexNotFound(LookupError):
    pass


def published_versions(warehouse: str) -> list[dict]:
    """corpus_stats rows of every published index version, oldest first."""
    uri = tables.table_uri(warehouse, tables.CORPUS_STATS)
    if not table_exists(uri):
        return []
    return sorted(read_table(uri).to_pylist(), key=lambda r: r["index_version"])


def find_index(warehouse: str, index_version: int | None = None, preset: str | None = None,
               enriched: bool | None = None) -> dict:
    """The requested version, or the newest published one matching `preset` / `enriched` when given. Versions of
    an older index layout are not served (their term ids or tables differ): they count as absent."""
    rows = [
        r for r in published_versions(warehouse)
        if (index_version is None or r["index_version"] == index_version)
        and (preset is None or r["preset"] == preset)
        and (enriched is None or bool(r["enriched"]) == enriched)
    ]
    current = [r for r in rows if r.get("layout") == tables.INDEX_LAYOUT]
    if not current:
        wanted = {"version": index_version, "preset": preset, "enriched": enriched}
        what = ", ".join(f"{k} {v}" for k, v in wanted.items() if v is not None) or "at all"
        older = f" ({len(rows)} built with an older index layout, which this version cannot read)" if rows else ""
        raise IndexNotFound(f"no published index ({what}) in warehouse {warehouse}{older}; run `sira index`")
    return current[-1]
