import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sira.jobs.ingest import IngestConfig, run
from sira.pipelines.storage.ingest import content_hash
from sira.pipelines.storage.delta_io import read_table
from sira.core.datasets import DatasetNotFound, resolve_beir, resolve_corpus


def write_lines(path, lines: list[bytes]):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


BAD_CORPUS = [
    json.dumps({"_id": "1", "title": "Good", "text": "first document"}).encode(),
    b'{"_id": "2", "title": "broken", "text": ',                                   # unparseable line
    json.dumps({"title": "no id", "text": "orphan"}).encode(),                       # missing id
    json.dumps({"_id": "1", "title": "Again", "text": "duplicate of the first"}).encode(),  # duplicate id
    json.dumps({"_id": "4", "title": "", "text": "   "}).encode(),                   # empty text
    b'{"_id": "5", "title": "bad bytes", "text": "caf\xe9"}',                        # invalid UTF-8
    json.dumps({"_id": "6", "title": "", "text": "title-less but fine"}).encode(),
    json.dumps(["not", "an", "object"]).encode(),
]


def test_bad_records_are_rejected_with_their_reason_and_nothing_is_lost(tmp_path):
    src = write_lines(tmp_path / "corpus.jsonl", BAD_CORPUS)
    wh = str(tmp_path / "wh")
    summary = run(IngestConfig(source=str(src), warehouse=wh))
    assert (summary["read"], summary["kept"], summary["rejected"]) == (8, 2, 6)
    docs = read_table(f"{wh}/docs").to_pylist()
    assert sorted(d["doc_id"] for d in docs) == ["1", "6"]
    assert {d["doc_id"]: d["content_hash"] for d in docs}["1"] == content_hash("Good", "first document")
    rejected = {r["record"]: r for r in read_table(f"{wh}/rejected").to_pylist()}
    assert sorted(rejected) == [2, 3, 4, 5, 6, 8]
    assert rejected[2]["reason"].startswith("unparseable JSON")
    assert rejected[3]["reason"].startswith("missing id")
    assert rejected[4]["reason"] == "duplicate id '1' (first seen at record 1)" and rejected[4]["doc_id"] == "1"
    assert rejected[5]["reason"] == "empty text"
    assert rejected[6]["reason"].startswith("invalid UTF-8 at byte")
    assert rejected[8]["reason"] == "expected a JSON object, got list"
    assert all(r["source"] == str(src) and r["raw"] for r in rejected.values())


def test_repeated_ids_are_found_across_flushes_and_buckets_as_a_dict_would(tmp_path, monkeypatch):
    import numpy as np
    from sira.pipelines.storage import ingest

    monkeypatch.setattr(ingest._DuplicateIds, "FLUSH_RECORDS", 97)  # many flushes, each bucket in many pieces
    rng = np.random.default_rng(3)
    ids = [f"doc{n}" for n in rng.integers(0, 3000, size=5000)]  # ~40% repeats, some ids four or five times
    check = ingest._DuplicateIds(tmp_path / "ids")
    first: dict[str, int] = {}
    expected = []
    for record, doc_id in enumerate(ids, start=1):
        check.add(doc_id, record)
        if doc_id in first:
            expected.append((record, first[doc_id]))
        else:
            first[doc_id] = record
    repeats, firsts = check.duplicates()
    assert list(zip(repeats.tolist(), firsts.tolist())) == expected
    assert not list((tmp_path / "ids").iterdir())  # the buckets are gone once read


def test_reingest_replaces_the_snapshot_in_one_new_version(tmp_path):
    wh = str(tmp_path / "wh")
    first = run(IngestConfig(source=str(write_lines(tmp_path / "a.jsonl", BAD_CORPUS[:1])), warehouse=wh))
    second = run(IngestConfig(source=str(write_lines(tmp_path / "b.jsonl", BAD_CORPUS[6:7])), warehouse=wh))
    assert second["docs_table_version"] == first["docs_table_version"] + 1
    assert [d["doc_id"] for d in read_table(f"{wh}/docs").to_pylist()] == ["6"]
    assert read_table(f"{wh}/rejected").num_rows == 0


def test_gzipped_jsonl_and_parquet_sources(tmp_path):
    gz = tmp_path / "c.jsonl.gz"
    with gzip.open(gz, "wb") as fh:
        fh.write(b"\n".join(BAD_CORPUS[:2]) + b"\n")
    assert run(IngestConfig(source=str(gz), warehouse=str(tmp_path / "w1")))["kept"] == 1

    pq.write_table(pa.table({"doc_id": ["p1", "p2", "p1"], "title": ["t", None, "t"], "text": ["x", "y", "z"]}),
                   tmp_path / "c.parquet")
    s = run(IngestConfig(source=str(tmp_path / "c.parquet"), warehouse=str(tmp_path / "w2")))
    assert (s["kept"], s["rejected"]) == (2, 1)


# Rows at the edges of parse_record's rules: the columnar path (Parquet) must keep and reject what the record path
# (JSONL) does, with the same reasons, ids, texts and record numbers.
EDGE_ROWS = [
    {"_id": "a", "id": None, "title": "T", "text": "plain", "contents": None},
    {"_id": None, "id": "from-id", "title": None, "text": "the second id column", "contents": None},
    {"_id": " \x1f ", "id": "blank-first", "title": "", "text": "a blank first id", "contents": None},
    {"_id": None, "id": None, "title": "orphan", "text": "no id at all", "contents": None},
    {"_id": "x" * 1001, "id": None, "title": "", "text": "an id too long", "contents": None},
    {"_id": "c", "id": None, "title": "", "text": None, "contents": "from contents"},
    {"_id": "d", "id": None, "title": "\u3000", "text": "\x1c\u2003 \x85", "contents": None},
    {"_id": "e", "id": None, "title": "title only", "text": "", "contents": None},
    {"_id": "a", "id": None, "title": "again", "text": "a repeated id", "contents": None},
    {"_id": "f", "id": None, "title": None, "text": " caf\u00e9 \U0001f600 ", "contents": None},
]


def test_parquet_rows_are_kept_and_rejected_as_the_same_jsonl_records_are(tmp_path):
    jsonl = write_lines(tmp_path / "edge.jsonl", [json.dumps(r).encode() for r in EDGE_ROWS])
    parquet = tmp_path / "edge.parquet"
    pq.write_table(pa.Table.from_pylist(EDGE_ROWS), parquet)
    outcomes = []
    for src in (jsonl, parquet):
        wh = str(tmp_path / f"wh-{src.suffix}")
        summary = run(IngestConfig(source=str(src), warehouse=wh))
        docs = sorted((d["doc_id"], d["title"], d["text"], d["content_hash"]) for d in read_table(f"{wh}/docs").to_pylist())
        rejected = sorted((r["record"], r["reason"]) for r in read_table(f"{wh}/rejected").to_pylist())
        outcomes.append((summary["read"], summary["kept"], docs, rejected))
    assert outcomes[0] == outcomes[1]
    read, kept, docs, rejected = outcomes[1]
    assert (read, kept) == (10, 6)
    assert [d[0] for d in docs] == ["a", "blank-first", "c", "e", "f", "from-id"]
    assert [r[0] for r in rejected] == [4, 5, 7, 9]


def test_integer_ids_of_a_parquet_source_become_their_decimal_text(tmp_path):
    pq.write_table(pa.table({"id": pa.array([7, None, -3], pa.int64()), "text": ["seven", "none", "minus three"]}),
                   tmp_path / "ints.parquet")
    wh = str(tmp_path / "wh")
    summary = run(IngestConfig(source=str(tmp_path / "ints.parquet"), warehouse=wh))
    assert (summary["kept"], summary["rejected"]) == (2, 1)
    assert sorted(d["doc_id"] for d in read_table(f"{wh}/docs").to_pylist()) == ["-3", "7"]
    assert [r["reason"] for r in read_table(f"{wh}/rejected").to_pylist()] == ["missing id (one of _id, doc_id, id, docid)"]


def test_beir_folder_source(tiny_beir, tmp_path):
    s = run(IngestConfig(source=str(tiny_beir), warehouse=str(tmp_path / "wh")))
    assert (s["read"], s["kept"], s["rejected"]) == (12, 12, 0)


def test_missing_beir_dataset_says_where_to_put_the_files(monkeypatch, tmp_path):
    monkeypatch.setenv("SIRA_DATA_DIR", str(tmp_path))
    with pytest.raises(DatasetNotFound, match=f"(?s)Put corpus.jsonl.*{tmp_path}/no-such-dataset"):
        resolve_beir("no-such-dataset", download=False)


def test_unknown_source_format_is_a_clear_error(tmp_path):
    (tmp_path / "corpus.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown format"):
        resolve_corpus(str(tmp_path / "corpus.csv"))


def test_merge_refuses_a_snapshot_that_would_empty_the_corpus(tmp_path):
    wh = str(tmp_path / "wh")
    docs = [json.dumps({"_id": str(i), "text": f"document {i}"}).encode() for i in range(10)]
    run(IngestConfig(source=str(write_lines(tmp_path / "full.jsonl", docs)), warehouse=wh, mode="merge"))
    before = read_table(f"{wh}/docs").sort_by("doc_id").to_pylist()
    truncated = write_lines(tmp_path / "truncated.jsonl", docs[:3] + [b'{"_id": "3", "te'])
    with pytest.raises(ValueError, match=r"would delete 7 of the 10 documents .*3 valid records, 1 rejected"):
        run(IngestConfig(source=str(truncated), warehouse=wh, mode="merge"))
    assert read_table(f"{wh}/docs").sort_by("doc_id").to_pylist() == before  # refused before any write
    s = run(IngestConfig(source=str(truncated), warehouse=wh, mode="merge", max_delete_fraction=1.0))
    assert s["changes"] == {"inserted": 0, "updated": 0, "deleted": 7, "unchanged": 3}


def test_a_merge_makes_the_table_equal_the_snapshot_and_keeps_unchanged_rows(tmp_path, monkeypatch):
    import sira.pipelines.storage.ingest as ingest_module

    monkeypatch.setattr(ingest_module, "MERGE_BATCH_ROWS", 4)  # several batches meet the table's keys
    wh = str(tmp_path / "wh")
    night1 = [{"_id": str(i), "title": f"t{i}", "text": f"document {i}"} for i in range(20)]
    night2 = [{**d, "text": d["text"] + " changed"} if d["_id"] in ("3", "11") else d
              for d in night1 if d["_id"] not in ("5", "17")] + [{"_id": "new1", "text": "a new one"},
                                                                {"_id": "new2", "text": "another"}]
    as_lines = lambda docs: [json.dumps(d).encode() for d in docs]  # noqa: E731
    run(IngestConfig(source=str(write_lines(tmp_path / "n1.jsonl", as_lines(night1))), warehouse=wh))
    before = {r["doc_id"]: r for r in read_table(f"{wh}/docs").to_pylist()}
    s = run(IngestConfig(source=str(write_lines(tmp_path / "n2.jsonl", as_lines(night2))), warehouse=wh,
                         mode="merge"))
    assert s["changes"] == {"inserted": 2, "updated": 2, "deleted": 2, "unchanged": 16}
    after = {r["doc_id"]: r for r in read_table(f"{wh}/docs").to_pylist()}
    assert {d: (r["title"], r["text"]) for d, r in after.items()} == \
        {d["_id"]: (d.get("title", ""), d["text"]) for d in night2}
    unchanged = [d for d in after if d in before and d not in ("3", "11")]
    assert len(unchanged) == 16 and all(after[d] == before[d] for d in unchanged)  # ingested_at kept too


def test_a_merge_keeps_the_first_of_repeated_ids_whichever_of_them_changed(tmp_path, monkeypatch):
    import sira.pipelines.storage.ingest as ingest_module

    # Only new or changed rows are spooled between the passes: a repeat's first record may be unchanged (not
    # spooled) while the repeat differs (spooled), or the other way round; the first record wins either way.
    monkeypatch.setattr(ingest_module, "MERGE_BATCH_ROWS", 3)
    wh = str(tmp_path / "wh")
    night1 = [{"_id": str(i), "text": f"document {i}"} for i in range(8)]
    as_lines = lambda docs: [json.dumps(d).encode() for d in docs]  # noqa: E731
    run(IngestConfig(source=str(write_lines(tmp_path / "n1.jsonl", as_lines(night1))), warehouse=wh))
    night2 = [{"_id": "4", "text": "document 4 changed"}] + night1 + [
        {"_id": "0", "text": "a repeat that differs"}, {"_id": "new", "text": "a new one"},
        {"_id": "new", "text": "a new one, repeated"}]
    s = run(IngestConfig(source=str(write_lines(tmp_path / "n2.jsonl", as_lines(night2))), warehouse=wh,
                         mode="merge"))
    assert s["changes"] == {"inserted": 1, "updated": 1, "deleted": 0, "unchanged": 7}
    assert (s["read"], s["kept"], s["rejected"]) == (12, 9, 3)
    after = {r["doc_id"]: r["text"] for r in read_table(f"{wh}/docs").to_pylist()}
    assert after == {**{d["_id"]: d["text"] for d in night1}, "4": "document 4 changed", "new": "a new one"}
    rejected = read_table(f"{wh}/rejected").to_pylist()
    assert sorted((r["record"], r["doc_id"]) for r in rejected) == [(6, "4"), (10, "0"), (12, "new")]
    assert all(r["reason"].startswith("duplicate id") for r in rejected)


def test_the_prompt_task_is_recorded_at_ingest_never_guessed_from_the_warehouse_name(tmp_path):
    from pydantic import ValidationError

    from conftest import write_beir_folder
    from sira.pipelines.storage.warehouse_info import warehouse_task

    corpus = write_lines(tmp_path / "corpus.jsonl", [json.dumps({"_id": "1", "text": "a document"}).encode()])
    named_like_a_dataset = str(tmp_path / "warehouses" / "scifact")
    assert warehouse_task(named_like_a_dataset) == "generic"  # nothing ingested: nothing recorded
    run(IngestConfig(source=str(corpus), warehouse=named_like_a_dataset))
    assert warehouse_task(named_like_a_dataset) == "generic"  # a plain file names no dataset, whatever the folder
    assert warehouse_task(named_like_a_dataset, "finance") == "finance"  # --task of a later job wins

    prod = str(tmp_path / "warehouses" / "prod")
    summary = run(IngestConfig(source=str(write_beir_folder(tmp_path / "data" / "scifact")), warehouse=prod))
    assert summary["task"] == "fact_check" and warehouse_task(prod) == "fact_check"  # the dataset's own task
    run(IngestConfig(source=str(corpus), warehouse=prod, mode="merge", max_delete_fraction=1))
    assert warehouse_task(prod) == "fact_check"  # a nightly snapshot keeps what was recorded
    run(IngestConfig(source=str(corpus), warehouse=prod, mode="merge", max_delete_fraction=1, task="argument"))
    assert warehouse_task(prod) == "argument"
    with pytest.raises(ValidationError, match="unknown task 'poetry'"):
        IngestConfig(source=str(corpus), warehouse=prod, task="poetry")


def test_a_merge_records_its_changes_in_the_change_data_feed_even_on_a_table_made_without_it(tmp_path):
    """The index build reads a night's changes from the feed: a table made before ingest turned it on gets it with
    its next MERGE, and the feed then holds exactly the rows that changed."""
    from deltalake import DeltaTable, write_deltalake

    from sira.pipelines.storage.delta_io import CHANGE_DATA_FEED, has_change_data, row_count

    wh = str(tmp_path / "wh")
    docs = [json.dumps({"_id": str(i), "text": f"document {i}"}).encode() for i in range(4)]
    run(IngestConfig(source=str(write_lines(tmp_path / "v0.jsonl", docs)), warehouse=wh))
    uri = f"{wh}/docs"
    assert DeltaTable(uri).metadata().configuration[CHANGE_DATA_FEED] == "true"
    old = str(tmp_path / "old")
    write_deltalake(f"{old}/docs", read_table(uri))  # as an older ingest wrote it: no feed
    night = docs[1:3] + [json.dumps({"_id": "9", "text": "new"}).encode()]
    for folder in (wh, old):
        run(IngestConfig(source=str(write_lines(tmp_path / "v1.jsonl", night)), warehouse=folder, mode="merge"))
    merged = f"{old}/docs"
    assert DeltaTable(merged).version() == 2  # the property, then the MERGE
    assert has_change_data(merged, 0, 2) and has_change_data(uri, 0, 1)
    assert row_count(merged) == row_count(uri) == 3
    feed = pa.table(DeltaTable(merged).load_cdf(starting_version=1).read_all())
    assert sorted(zip(feed["doc_id"].to_pylist(), feed["_change_type"].to_pylist())) == [
        ("0", "delete"), ("3", "delete"), ("9", "insert")]
    run(IngestConfig(source=str(write_lines(tmp_path / "v2.jsonl", docs)), warehouse=wh))  # a rewrite: no feed
    assert not has_change_data(uri, 1, 2)
