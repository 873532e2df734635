"""`sira proposals export|import`: LLM proposals move between warehouses as Parquet, merged on the table's key."""

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sira.jobs.cli import app
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.proposal_transfer import export_proposals, import_proposals
from sira.pipelines.enrichment.ray_enrich import commit
from sira.core import tables


def _ingested(tmp_path, tiny_beir, name):
    from sira.jobs import ingest as ingest_job

    wh = str(tmp_path / name)
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    return wh


def _rows(docs: pa.Table, phrases_by_doc: dict, version="doc-generic-v1", error_for=()) -> pa.Table:
    hashes = dict(zip(docs["doc_id"].to_pylist(), docs["content_hash"].to_pylist()))
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([
        {"doc_id": d, "content_hash": hashes.get(d, "0" * 16), "model": "m", "prompt_version": version,
         "backend": "local", "phrases": [] if d in error_for else p, "weights": None, "raw_output": str(p),
         "input_tokens": 10, "output_tokens": 5, "latency_ms": 1.0,
         "error": "no JSON found" if d in error_for else None, "enriched_at": now}
        for d, p in phrases_by_doc.items()])


@pytest.fixture()
def source(tmp_path, tiny_beir):
    wh = _ingested(tmp_path, tiny_beir, "source")
    docs = read_table(tables.table_uri(wh, tables.DOCS), columns=["doc_id", "content_hash"])
    commit(wh, _rows(docs, {"d01": ["MI", "cardiac arrest"], "d02": ["ASA"], "d03": ["x"]}, error_for={"d03"}))
    commit(wh, _rows(docs, {"d01": ["other version"]}, version="doc-generic-v2"))
    return wh, docs


def test_export_then_import_moves_every_good_row_once(tmp_path, tiny_beir, source):
    wh, docs = source
    out = tmp_path / "export" / "enrichment.parquet"
    summary = export_proposals(wh, out, prompt_version="doc-generic-v1")
    assert summary["rows"] == 2 and summary["errors_left_out"] == 1
    assert summary["versions"] == {"m / doc-generic-v1": 2}
    exported = pq.read_table(out)
    assert exported.schema.names == tables.ENRICHMENT_SCHEMA.names  # readable by anyone, no SIRA code needed
    assert exported["doc_id"].to_pylist() == ["d01", "d02"]

    target = _ingested(tmp_path, tiny_beir, "target")
    first = import_proposals(target, out)
    assert (first["rows"], first["inserted"], first["already_present"], first["stale"]) == (2, 2, 0, 0)
    again = import_proposals(target, out)  # idempotent: a rerun duplicates nothing
    assert (again["inserted"], again["already_present"]) == (0, 2)
    landed = read_table(tables.table_uri(target, tables.ENRICHMENT)).sort_by("doc_id")
    assert landed["doc_id"].to_pylist() == ["d01", "d02"]
    assert landed["phrases"].to_pylist() == [["MI", "cardiac arrest"], ["ASA"]]


def test_import_leaves_out_rows_for_text_the_warehouse_no_longer_holds(tmp_path, tiny_beir, source):
    wh, docs = source
    rows = _rows(docs, {"d01": ["MI"], "gone": ["orphan"]})
    rows = rows.set_column(1, "content_hash", pa.array([docs["content_hash"][0].as_py(), "stale-hash"]))
    path = tmp_path / "mixed.parquet"
    pq.write_table(rows.cast(tables.ENRICHMENT_SCHEMA), path)
    target = _ingested(tmp_path, tiny_beir, "target")
    summary = import_proposals(target, path)
    assert (summary["inserted"], summary["stale"]) == (1, 1)


def test_import_keeps_a_good_row_and_replaces_an_errored_one(tmp_path, tiny_beir, source):
    wh, docs = source
    out = tmp_path / "good.parquet"
    export_proposals(wh, out, prompt_version="doc-generic-v1")
    # The target already holds d01 (good, different phrases) and d02 (errored): d01 stays, d02 is replaced.
    target = _ingested(tmp_path, tiny_beir, "target")
    commit(target, _rows(docs, {"d01": ["kept"], "d02": []}, error_for={"d02"}))
    summary = import_proposals(target, out)
    assert summary["inserted"] == 0 and summary["already_present"] == 2
    landed = read_table(tables.table_uri(target, tables.ENRICHMENT)).sort_by("doc_id")
    assert landed["phrases"].to_pylist() == [["kept"], ["ASA"]] and landed["error"].to_pylist() == [None, None]


def test_bad_exports_are_clear_errors(tmp_path, tiny_beir, source):
    wh, docs = source
    target = _ingested(tmp_path, tiny_beir, "target")
    with pytest.raises(FileNotFoundError, match="no such Parquet file"):
        import_proposals(target, tmp_path / "missing.parquet")
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"doc_id": ["d01"], "phrases": [["x"]]}), wrong)
    with pytest.raises(ValueError, match=r"wrong.parquet: not a enrichment export: columns \['content_hash'"):
        import_proposals(target, wrong)
    twice = tmp_path / "twice.parquet"
    rows = _rows(docs, {"d01": ["a"]})
    pq.write_table(pa.concat_tables([rows, rows]).cast(tables.ENRICHMENT_SCHEMA), twice)
    with pytest.raises(ValueError, match="1 keys occur more than once, first {'doc_id': 'd01'"):
        import_proposals(target, twice)
    with pytest.raises(ValueError, match="unknown proposal table 'docs'"):
        export_proposals(wh, tmp_path / "x.parquet", table="docs")
    with pytest.raises(FileNotFoundError, match="no expansions table"):
        export_proposals(wh, tmp_path / "x.parquet", table="expansions")


def test_cli_round_trip(tmp_path, tiny_beir, source):
    wh, _ = source
    out = tmp_path / "cli.parquet"
    runner = CliRunner()
    result = runner.invoke(app, ["proposals", "export", "-w", wh, "-o", str(out), "--model", "m"])
    assert result.exit_code == 0, result.output
    assert "exported 3 enrichment rows" in result.output
    target = _ingested(tmp_path, tiny_beir, "target")
    result = runner.invoke(app, ["proposals", "import", str(out), "-w", target, "--output-json",
                                 str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    assert "imported 3 enrichment rows" in result.output
