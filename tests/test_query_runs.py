"""`sira query` over a query file of any length: lines streamed in chunks, bad lines rejected with their line number
and reason and kept in the runs table, a run stopped between commits resumed after its last committed line, and
the TREC and Parquet runs written from the table in line order."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sira.pipelines.serving import query_runs
from sira.pipelines.serving.query_runs import QueryLine, SeenIds, iter_queries
from conftest import TINY_QUERIES

LINES = [
    '{"_id": "q1", "text": "heart attack risk"}',
    '{"_id": "q2", "text": "insulin and blood glucose"}',
    '{"_id": "q3", "text": "blood pressure"',            # 3: not JSON
    '{"text": "no id here"}',                             # 4: no query id
    '{"_id": "q4", "text": "   "}',                       # 5: empty text
    '["q5", "a list"]',                                   # 6: not an object
    '{"_id": "q1", "text": "heart attack again"}',        # 7: a repeated id
    '{"qid": 6, "query": "cafe caffeine"}',               # 8: the other field names, a numeric id
    '{"_id": "q7", "text": "blood pressure"}',
    '{"_id": "q8", "text": "zzzz unknownword"}',
]


def write_queries(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def test_bad_lines_come_with_their_line_and_reason(tmp_path):
    path = write_queries(tmp_path / "q.jsonl.gz", LINES)
    got = list(iter_queries(str(path)))
    assert [(q.line, q.qid, q.error) for q in got if q.error] == [
        (3, "", "not JSON: Expecting ',' delimiter at column 39"), (4, "", "no query id"),
        (5, "q4", "empty query text"), (6, "", "expected a JSON object, got list")]
    assert [(q.line, q.qid, q.text) for q in got if not q.error][-3:] == [
        (8, "6", "cafe caffeine"), (9, "q7", "blood pressure"), (10, "q8", "zzzz unknownword")]
    assert [q.line for q in iter_queries(str(path), after=8)] == [9, 10]
    tsv = tmp_path / "q.tsv"
    tsv.write_bytes(b"a\tfirst query\nno tab here\nb\t\nc\t\xff\xfe bytes\n")
    assert [(q.line, q.qid, q.error) for q in iter_queries(str(tsv))] == [
        (1, "a", None), (2, "", "expected qid<TAB>text"), (3, "b", "empty query text"),
        (4, "", "not UTF-8: invalid start byte at byte 2")]
    with pytest.raises(FileNotFoundError, match="not found"):
        next(iter_queries(str(tmp_path / "missing.jsonl")))


def test_seen_ids_hold_what_was_added_across_merges(monkeypatch):
    monkeypatch.setattr(SeenIds, "MERGE_EVERY", 4)
    seen = SeenIds()
    for i in range(0, 40, 2):
        seen.add(f"q{i}")
    assert all(f"q{i}" in seen for i in range(0, 40, 2)) and not any(f"q{i}" in seen for i in range(1, 40, 2))
    assert len(seen._sorted) == 20 and not seen._recent


@pytest.fixture()
def warehouse(tiny_warehouse, tmp_path) -> str:
    return str(shutil.copytree(tiny_warehouse, tmp_path / "wh"))


def run_query(warehouse, queries: Path, out: Path, **options) -> dict:
    from sira.jobs import query as query_job

    return query_job.run(query_job.QueryConfig(warehouse=str(warehouse), queries=str(queries), out=out,
                                                run_id="bulk", k=5, expand=False, **options))


def test_a_run_rejects_bad_lines_goes_on_and_writes_trec_and_parquet_in_line_order(warehouse, tmp_path):
    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    queries = write_queries(tmp_path / "q.jsonl.gz", LINES)
    summary = run_query(warehouse, queries, tmp_path / "bulk.trec", commit_every=3)
    assert (summary["scored"], summary["rejected"], summary["skipped"]) == (5, 5, 0)
    rows = sorted(read_table(tables.table_uri(warehouse, tables.RUNS)).to_pylist(), key=lambda r: r["line"])
    assert [r["line"] for r in rows] == list(range(1, 11))  # every line once, in four commits
    assert [(r["line"], r["error"]) for r in rows if r["error"]][-1] == (7, "repeated query id (its first line is "
                                                                          "scored)")
    assert rows[2]["query"] == LINES[2] and rows[2]["program"] == "" and rows[2]["doc_ids"] == []
    trec = [line.split() for line in (tmp_path / "bulk.trec").read_text().splitlines()]
    assert list(dict.fromkeys(t[0] for t in trec)) == ["q1", "q2", "6", "q7"]  # line order; q8 matches nothing
    scored = {r["qid"]: r for r in rows if r["error"] is None}
    assert [t[2] for t in trec if t[0] == "q1"] == scored["q1"]["doc_ids"]
    assert [int(t[3]) for t in trec if t[0] == "q1"] == list(range(1, len(scored["q1"]["doc_ids"]) + 1))
    parquet = pq.read_table(tmp_path / "bulk.parquet").to_pylist()
    assert [(p["qid"], p["doc_id"], p["rank"], f"{p['score']:.6f}") for p in parquet] == \
        [(t[0], t[2], int(t[3]), t[4]) for t in trec]
    assert {p["program_id"] for p in parquet if p["qid"] == "q1"} == \
        {query_runs.program_id(scored["q1"]["program"])}

    again = run_query(warehouse, queries, tmp_path / "again.trec")  # nothing left: no work, the same outputs
    assert (again["scored"], again["skipped"], again["rejected"]) == (0, 5, 5)
    assert (tmp_path / "again.trec").read_text() == (tmp_path / "bulk.trec").read_text()


def test_a_run_stopped_between_commits_resumes_to_an_uninterrupted_one(warehouse, tiny_warehouse, tmp_path,
                                                                       monkeypatch):
    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    lines = [json.dumps({"_id": f"g{i:03d}", "text": TINY_QUERIES[f"q{i % 5 + 1}"] + f" w{i}"}) for i in range(23)]
    queries = write_queries(tmp_path / "q.jsonl.gz", lines)
    commit = query_runs.QueryRun.commit
    calls = []

    def stopping(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped after two commits")
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(query_runs.QueryRun, "commit", stopping)
    with pytest.raises(KeyboardInterrupt):
        run_query(warehouse, queries, tmp_path / "stopped.trec", commit_every=5)
    monkeypatch.setattr(query_runs.QueryRun, "commit", commit)
    assert len(read_table(tables.table_uri(warehouse, tables.RUNS))) == 10
    resumed = run_query(warehouse, queries, tmp_path / "stopped.trec", commit_every=7)  # other chunk bounds too
    assert (resumed["scored"], resumed["skipped"]) == (13, 10)
    reference = str(shutil.copytree(tiny_warehouse, tmp_path / "reference"))
    run_query(reference, queries, tmp_path / "reference.trec")
    assert (tmp_path / "stopped.trec").read_text() == (tmp_path / "reference.trec").read_text()
    assert pq.read_table(tmp_path / "stopped.parquet").equals(pq.read_table(tmp_path / "reference.parquet"))
    with pytest.raises(ValueError, match=r"scored on index v[2-9], not v1"):  # the newest when the run began
        run_query(warehouse, queries, tmp_path / "mixed.trec", index_version=1)


def test_a_runs_table_of_the_older_layout_is_named_not_appended_to(warehouse, tmp_path):
    import pyarrow as pa

    from sira.pipelines.storage.delta_io import write_table
    from sira.core import tables

    write_table(tables.table_uri(warehouse, tables.RUNS), pa.table({"run_id": ["old"], "qid": ["q1"]}))
    with pytest.raises(ValueError, match="before runs recorded line numbers"):
        run_query(warehouse, write_queries(tmp_path / "q.jsonl.gz", LINES[:2]), tmp_path / "x.trec")


def test_hits_table_ranks_each_querys_hits_from_one():
    import pyarrow as pa

    rows = pa.table({"qid": ["a", "b", "c"], "doc_ids": [["x", "y"], [], ["z"]],
                     "scores": pa.array([[2.0, 1.0], [], [0.5]], pa.list_(pa.float32())),
                     "program_id": ["p", "p", "r"]})
    assert query_runs._hits_table(rows).to_pylist() == [
        {"qid": "a", "doc_id": "x", "rank": 1, "score": 2.0, "program_id": "p"},
        {"qid": "a", "doc_id": "y", "rank": 2, "score": 1.0, "program_id": "p"},
        {"qid": "c", "doc_id": "z", "rank": 1, "score": 0.5, "program_id": "r"}]
    assert QueryLine(1, "a", "t").error is None


def test_trec_lines_write_scores_as_python_does():
    import numpy as np
    import pyarrow as pa

    from sira.core.trec_format import trec_lines

    scores = np.array([0.0, 5e-7, 1.5e-6, 2.5e-7, 1.5, 213.22705, 123456.78, 1e-5 / 3, -0.25], np.float32)
    hits = pa.table({"qid": ["q"] * len(scores), "doc_id": [f"d{i}" for i in range(len(scores))],
                     "rank": pa.array(range(1, len(scores) + 1), pa.int32()), "score": pa.array(scores),
                     "program_id": ["p"] * len(scores)}, schema=query_runs.PARQUET_RUN_SCHEMA)
    part = hits.slice(1)  # a slice: the string columns' offsets do not start at 0
    assert trec_lines(part["qid"], part["doc_id"], part["rank"], part["score"], "t").decode() == "".join(
        f"q Q0 d{i} {i + 1} {float(s):.6f} t\n" for i, s in enumerate(scores) if i >= 1)
    chunked = pa.chunked_array([pa.array(["a", "bb"]), pa.array(["ccc"])])
    assert trec_lines(chunked, chunked, [1, 2, 10], np.array([1.0, 2.0, 3.0]), "run").decode().splitlines() == [
        "a Q0 a 1 1.000000 run", "bb Q0 bb 2 2.000000 run", "ccc Q0 ccc 10 3.000000 run"]
    assert trec_lines(pa.array([], pa.string()), pa.array([], pa.string()), [], [], "t") == b""
    with pytest.raises(ValueError, match="one word"):
        trec_lines(chunked, chunked, [1, 2, 3], [1.0, 2.0, 3.0], "two words")
    with pytest.raises(ValueError, match="qid and a doc_id"):
        trec_lines(pa.array(["a", None]), pa.array(["x", "y"]), [1, 2], [1.0, 1.0], "t")


def test_query_workers_shard_actors_and_the_in_process_scorer_write_the_same_runs(warehouse, tiny_warehouse,
                                                                                  tmp_path):
    queries = write_queries(tmp_path / "q.jsonl.gz", LINES)
    # Batches of one query over two workers, two chunks in flight: the rows still come back in line order.
    workers = run_query(warehouse, queries, tmp_path / "workers.trec", workers=2, batch_size=1, commit_every=4)
    assert (workers["scorer"], workers["scored"], workers["rejected"]) == ("workers", 5, 5)
    for scorer in ("actors", "local"):
        other = str(shutil.copytree(tiny_warehouse, tmp_path / scorer))
        summary = run_query(other, queries, tmp_path / f"{scorer}.trec", scorer=scorer)
        assert (summary["scored"], summary["rejected"]) == (5, 5)
        assert (tmp_path / f"{scorer}.trec").read_text() == (tmp_path / "workers.trec").read_text()
        assert pq.read_table(tmp_path / f"{scorer}.parquet").equals(pq.read_table(tmp_path / "workers.parquet"))
