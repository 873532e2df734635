"""Reliability on malformed and oversized input (issue 7): every record read becomes a document or a counted
reject with a clear reason and its record number; nothing is lost, nothing duplicated.

tests/test_ingest.py covers broken JSON, a missing id, a duplicate id, empty text, invalid UTF-8 and a
non-object one by one; this file adds field types, long lines, a 10 MB document and all bad kinds in one file.
"""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import TINY_DOCS
from sira.jobs.ingest import IngestConfig, run
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.storage.ingest import content_hash
from sira.core import tables
from sira.core.datasets import MAX_ID_CHARS, RawRecord, RecordError, iter_lines, parse_record
from test_ingest import BAD_CORPUS, write_lines

MB = 2**20
LINE_1M = 1_000_000


def record(obj) -> RawRecord:
    return RawRecord("test", 1, json.dumps(obj).encode())


@pytest.mark.parametrize("obj, doc", [
    ({"_id": 7, "text": "numeric ids become strings"}, ("7", "", "numeric ids become strings")),
    ({"_id": 0, "text": "zero is an id"}, ("0", "", "zero is an id")),
    ({"_id": "t", "title": "Title only"}, ("t", "Title only", "")),  # no text field: the title is the doc
    ({"_id": "t", "title": "Title only", "text": None}, ("t", "Title only", "")),
    ({"_id": "c", "contents": "Pyserini's field name"}, ("c", "", "Pyserini's field name")),
    ({"_id": " ", "doc_id": "fallback", "text": "x"}, ("fallback", "", "x")),         # a blank id is no id
])
def test_records_that_are_kept_and_how_they_are_normalised(obj, doc):
    assert parse_record(record(obj)) == doc


@pytest.mark.parametrize("obj, reason", [
    ({"_id": "a"}, "empty text"),                                                     # no text, no title
    ({"_id": "a", "text": None}, "empty text"),
    ({"_id": "a", "text": 42}, "text must be a string, got int"),
    ({"_id": "a", "text": ["a", "list"]}, "text must be a string, got list"),
    ({"_id": "a", "title": 3.5, "text": "x"}, "title must be a string, got float"),
    ({"_id": True, "text": "x"}, "id must be a string or integer, got bool"),
    ({"_id": 1.5, "text": "x"}, "id must be a string or integer, got float"),
    ({"_id": {"nested": 1}, "text": "x"}, "id must be a string or integer, got dict"),
    ({"_id": "   ", "text": "x"}, "missing id (one of _id, doc_id, id, docid)"),
    ({"_id": "x" * (MAX_ID_CHARS + 1), "text": "x"}, f"id too long (1001 characters; the limit is {MAX_ID_CHARS})"),
])
def test_records_that_are_rejected_say_why(obj, reason):
    with pytest.raises(RecordError) as err:
        parse_record(record(obj))
    assert str(err.value) == reason


@pytest.mark.parametrize("compressed", [False, True])
def test_long_lines_are_read_whole_from_plain_and_gzipped_files(tmp_path, compressed):
    lines = [b"\xef\xbb\xbf" + b'{"_id": "bom"}', b"a" * (10 * MB), b"", b"b" * LINE_1M, b"last"]
    payload = b"\r\n".join(lines) + b"\r\n"
    path = tmp_path / ("c.jsonl.gz" if compressed else "c.jsonl")
    path.write_bytes(gzip.compress(payload) if compressed else payload)
    got = list(iter_lines(path))
    # Line numbers stay true to the file (the blank line 3 is skipped, not renumbered); a leading BOM is dropped.
    assert [(n, len(line)) for n, line in got] == [(1, 14), (2, 10 * MB), (4, LINE_1M), (5, 4)]
    assert got[0][1] == b'{"_id": "bom"}' and got[1][1] == b"a" * (10 * MB)


def mixed_corpus() -> tuple[list[bytes], dict[int, str]]:
    """Every bad kind in one file, with good records between and after them: the lines, and record -> reason."""
    kinds = [
        (b"\xef\xbb\xbf" + json.dumps({"_id": "g1", "text": "saved by a Windows tool, BOM first"}).encode(), None),
        *zip(BAD_CORPUS, [None, "unparseable JSON", "missing id", "duplicate id '1' (first seen at record 2)",
                          "empty text", "invalid UTF-8 at byte", None, "expected a JSON object, got list"]),
        (b"z" * LINE_1M, "unparseable JSON: Expecting value at column 1"),          # a 1M-char line of garbage
        (b'{"_id": "t1", "text": "' + b"a" * LINE_1M, "unparseable JSON: Unterminated string starting at column 23"),
        (b'{"_id": "u1", "text": "' + b"\xff" * LINE_1M + b'"}', "invalid UTF-8 at byte 23"),
        (json.dumps({"_id": "l" * LINE_1M, "text": "x"}).encode(), f"id too long ({LINE_1M} characters"),
        (json.dumps({"_id": "g2", "text": "after the long lines"}).encode(), None),
        (json.dumps({"_id": "m1", "title": ""}).encode(), "empty text"),              # text field missing
        (json.dumps({"_id": "n1", "text": 12}).encode(), "text must be a string, got int"),
        (json.dumps({"_id": "n2", "text": None}).encode(), "empty text"),
        (json.dumps({"_id": 77, "text": "a numeric id"}).encode(), None),
        (json.dumps({"_id": "77", "text": "the same id as a string"}).encode(),
         f"duplicate id '77' (first seen at record {len(BAD_CORPUS) + 10})"),
        (json.dumps({"_id": True, "text": "x"}).encode(), "id must be a string or integer, got bool"),
        (b"", None),                                                               # a blank line: not a record
        (json.dumps({"_id": "g3", "text": "the last record"}).encode(), None),
    ]
    return [line for line, _ in kinds], {n: r for n, (line, r) in enumerate(kinds, start=1) if r and line}


def test_every_bad_kind_in_one_file_is_counted_and_kept_with_its_reason(tmp_path):
    lines, reasons = mixed_corpus()
    src = write_lines(tmp_path / "mixed.jsonl", lines)
    wh = str(tmp_path / "wh")
    summary = run(IngestConfig(source=str(src), warehouse=wh))

    docs = read_table(f"{wh}/docs").to_pylist()
    rejected = {r["record"]: r for r in read_table(f"{wh}/rejected").to_pylist()}
    assert sorted(d["doc_id"] for d in docs) == ["1", "6", "77", "g1", "g2", "g3"]
    assert summary["read"] == len(lines) - 1 == summary["kept"] + summary["rejected"]  # the blank line is no record
    assert summary["rejected"] == len(rejected) == len(reasons)                        # nothing lost
    assert sorted(rejected) == sorted(reasons)                                          # each under its record number
    for n, reason in reasons.items():
        assert rejected[n]["reason"].startswith(reason), (n, rejected[n]["reason"])
    assert rejected[len(BAD_CORPUS) + 11]["doc_id"] == "77"
    # A 1M-character line is kept as its first RAW_KEEP_CHARS characters; the reason stays one short line.
    long_ones = [r for r in rejected.values() if len(r["raw"]) == tables.RAW_KEEP_CHARS]
    assert len(long_ones) == 4 and all(len(r["reason"]) < 100 for r in rejected.values())
    assert summary["rejected_by_reason"] == {
        "unparseable JSON": 3, "missing id": 1, "duplicate id": 2, "empty text": 3,
        "invalid UTF-8 at byte": 2, "expected a JSON object, got list": 1,
        "id too long": 1, "text must be a string, got int": 1, "id must be a string or integer, got bool": 1}


def test_a_10_mb_document_is_kept_whole_and_indexed_whole(tmp_path, spark):
    from sira.jobs import index as index_job
    from sira.pipelines.serving.shard_loader import load_searcher
    from sira.core.analysis import Analyzer
    from sira.core.presets import get_preset

    sentence = "Tidal turbines convert the kinetic energy of ocean currents into electricity. "
    repeats = 10 * MB // len(sentence)
    big_text = sentence * repeats + "zanzibarite"  # 10 MB, a rare word at the very end
    big = {"_id": "big", "title": "Tidal power", "text": big_text}
    src = write_lines(tmp_path / "corpus.jsonl", [json.dumps(d).encode() for d in [*TINY_DOCS, big]])
    wh = str(tmp_path / "wh")
    summary = run(IngestConfig(source=str(src), warehouse=wh))
    assert (summary["read"], summary["kept"], summary["rejected"]) == (13, 13, 0)
    stored = {d["doc_id"]: d for d in read_table(f"{wh}/docs").to_pylist()}["big"]
    assert stored["text"] == big_text and stored["content_hash"] == content_hash("Tidal power", big_text)

    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)
    searcher, manifest = load_searcher(wh)
    assert manifest["num_docs"] == 13
    # Indexed whole: the word 10 MB in is found, and the doc length counts every term of the document.
    assert [h.doc_id for h in searcher.search("zanzibarite")] == ["big"]
    lens = {r["doc_id"]: r["doc_len"] for r in read_table(
        f"{wh}/segment_docs", filters=[("segment", "in", manifest["segments"])]).to_pylist()}
    analyzer = Analyzer(get_preset("sira").analyzer)
    unigrams = len(analyzer.tokens("Tidal power")) + repeats * len(analyzer.tokens(sentence)) + 1
    assert analyzer.config.max_n == 2 and lens["big"] == 2 * unigrams - 1  # unigrams and bigrams
    # The long document does not crowd out the short ones on their own words.
    assert searcher.search("insulin pancreas", k=1)[0].doc_id == "d05"
