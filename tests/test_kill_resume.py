"""Reliability (issue 7): `sira index` and `sira query` killed with SIGKILL part-way, then run again, end exactly
where an uninterrupted job ends: nothing lost, nothing duplicated, and readers never see a half-written index
version. Each killed job runs as a real `python -m sira.jobs.cli` process in a session of its own, so that SIGKILL takes
its whole process group (the Spark JVM, the local Ray) like an OOM kill or a lost machine would; the reruns and the
uninterrupted references run in this process (a cold JVM or Ray start costs a minute on 2 cores). The enrich case is
test_enrich_openai.py::test_killed_job_keeps_its_commits_and_a_rerun_completes_without_duplicates; a whole night
killed in its enrichment is in test_nightly.py."""

from __future__ import annotations

import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import TINY_DOCS, TINY_QUERIES, committed_since, kill_when, start_job, write_beir_folder
from sira.jobs import index as index_job
from sira.jobs import ingest as ingest_job
from sira.jobs import query as query_job
from sira.pipelines.storage.delta_io import read_table, table_version
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.ray_enrich import commit
from sira.pipelines.index.catalog import IndexNotFound, find_index, published_versions
from sira.pipelines.serving.shard_loader import load_searcher
from sira.core import tables
from test_index_enrichment import enrichment_rows

pytestmark = pytest.mark.integration

INDEX_ARGS = ["--preset", "sira", "--shards", "2", "--enrichment", "--tau", "0.25", "--spark-master", "local[2]"]
# The build's data tables in the order it writes them, each with the key a version's (or its new segment's) rows
# must not repeat.
INDEX_TABLE_KEYS = {
    tables.SEGMENT_DOCS: ("doc_id",),
    tables.SEGMENT_POSTINGS: ("shard", "term_id", "block"),
    tables.TERM_STATS: ("term_id",),
    tables.TOMBSTONES: ("segment", "shard", "doc_ord"),
    tables.SEGMENT_INJECTIONS: ("doc_id", "position"),
}
# Night 2 of the incremental build that gets killed: one document changed, one deleted, one added.
NIGHT_2 = [{**d, "text": d["text"] + " Clots too."} if d["_id"] == "d03" else d for d in TINY_DOCS
           if d["_id"] != "d08"] + [{"_id": "d13", "title": "Zebrafish", "text": "Zebrafish regenerate heart tissue."}]
QUERY_COMMIT = 256  # `sira query --commit-every`: the query-file lines of one runs-table commit
NUM_QUERIES = 4 * QUERY_COMMIT


@pytest.fixture(scope="module")
def base_warehouse(tmp_path_factory, tiny_beir, spark) -> Path:
    """The state every job here starts from: the tiny corpus, some enrichment and index v1 (plain) published."""
    wh = tmp_path_factory.mktemp("kill") / "base"
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=str(wh)))
    commit(str(wh), enrichment_rows(read_table(f"{wh}/docs"), {
        "d02": ["myocardial infarction", "blood", "antiplatelet"], "d04": ["hyperglycemia"], "d09": ["espresso"]}))
    index_job.run(index_job.IndexConfig(warehouse=str(wh), preset="pyserini-flat", shards=1, enrichment=False),
                  spark=spark)
    return wh


def copy_of(base: Path, to: Path) -> str:
    return str(shutil.copytree(base, to))


def version_rows(wh: str, table: str, version: int) -> list[dict]:
    """The rows of `version` (per-version tables) or of its new segment (per-segment tables)."""
    column = "segment" if table in tables.PER_SEGMENT_TABLES else "index_version"
    return read_table(tables.table_uri(wh, table), filters=[(column, "=", version)]).to_pylist()


def night_2(wh: str, tmp_path: Path, spark) -> None:
    """An enriched index of night 1, then night 2's snapshot merged in: the next enriched build is incremental."""
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=True, tau=0.25), spark=spark)
    snapshot = tmp_path / f"night2-{Path(wh).name}.jsonl"
    snapshot.write_text("".join(json.dumps(d) + "\n" for d in NIGHT_2), encoding="utf-8")
    ingest_job.run(ingest_job.IngestConfig(source=str(snapshot), warehouse=wh, mode="merge"))


@pytest.fixture(scope="module")
def night_and_reference(base_warehouse, tmp_path_factory, spark) -> tuple[Path, str]:
    """Night 2 merged in but not yet indexed (each kill test copies it), and a copy of it indexed uninterrupted:
    built once for every kill point, since the tests only read the reference."""
    root = tmp_path_factory.mktemp("night")
    night = copy_of(base_warehouse, root / "night")
    night_2(night, root, spark)
    reference = copy_of(Path(night), root / "reference")
    index_job.run(index_job.IndexConfig(warehouse=reference, preset="sira", shards=2, enrichment=True, tau=0.25),
                  spark=spark)  # the same job as INDEX_ARGS, uninterrupted
    assert len(find_index(reference)["segments"]) == 2, "the reference build was not incremental"
    return Path(night), reference


def rankings(wh: str, queries: list[str]) -> dict[str, list[tuple[str, float]]]:
    searcher, _ = load_searcher(wh)
    return {q: [(h.doc_id, h.score) for h in searcher.search(q, k=len(TINY_DOCS))] for q in queries}


def vocabulary() -> list[str]:
    return sorted({w for d in TINY_DOCS for w in re.findall(r"\w+", f"{d['title']} {d['text']}".lower())})


# Killed right after the night's analyses commit (while it decides the injections: no row of the version is written
# yet, but the kept analyses and the dictionary have grown), after the new segment's postings commit (its docs and
# postings are written; the version's term_stats, tombstones, decisions and the publishing corpus_stats row are
# not), or after its tombstones commit (the decisions of the documents entering and the corpus_stats row are not).
@pytest.mark.parametrize("killed_after", [tables.DOC_ANALYSIS, tables.SEGMENT_POSTINGS, tables.TOMBSTONES])
def test_killed_index_build_stays_invisible_and_a_rerun_publishes_the_same_index(night_and_reference, tmp_path,
                                                                                  spark, killed_after):
    night, reference = night_and_reference
    wh = copy_of(night, tmp_path / "killed")
    before = [r["index_version"] for r in published_versions(wh)]
    previous = find_index(wh)["index_version"]
    new = previous + 1
    queries = [*TINY_QUERIES.values(), *vocabulary()]
    previous_rankings = rankings(wh, queries)
    command = ["index", "--warehouse", wh, *INDEX_ARGS]

    log = tmp_path / "killed.log"
    kill_when(start_job(command, log), log, committed_since(tables.table_uri(wh, killed_after)))
    if killed_after != tables.DOC_ANALYSIS:
        assert version_rows(wh, tables.SEGMENT_POSTINGS, new), "the kill came before the build wrote its postings"
    assert [r["index_version"] for r in published_versions(wh)] == before, \
        f"the kill came after the publish:\n{log.read_text()}"
    # Readers keep the previous version, whole, and cannot ask for the half-written one.
    assert find_index(wh)["index_version"] == previous
    with pytest.raises(IndexNotFound):
        find_index(wh, index_version=new)
    assert rankings(wh, queries) == previous_rankings

    # The rerun: the same job in this process (its Spark session is up already; a JVM start is slow on 2 cores).
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=True, tau=0.25), spark=spark)
    published = [r["index_version"] for r in published_versions(wh)]
    assert published == [*before, new]  # the half-written version's number is reused, and published once
    manifest, expected = find_index(wh), find_index(reference)
    skip = {"built_at", *(f"{table}_table_version" for table in INDEX_TABLE_KEYS)}  # commit counts differ
    assert {c: v for c, v in manifest.items() if c not in skip} == {c: v for c, v in expected.items() if c not in skip}
    assert manifest["phrases_kept"] > 0  # injections too, which the killed build had not reached
    assert rankings(wh, queries) == rankings(reference, queries)
    for table, key in INDEX_TABLE_KEYS.items():
        rows = version_rows(wh, table, new)
        repeated = [k for k, n in Counter(tuple(r[c] for c in key) for r in rows).items() if n > 1]
        assert not repeated, f"{table} repeats {key} {repeated[:5]} in version {new}"
        by_key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
        assert sorted(rows, key=by_key) == sorted(version_rows(reference, table, new), key=by_key), table


def test_killed_query_run_resumes_to_the_runs_of_an_uninterrupted_one(base_warehouse, tmp_path, spark):
    rng = random.Random(7)
    words = vocabulary()
    queries = {f"g{i:04d}": " ".join(rng.sample(words, rng.randint(1, 4))) for i in range(NUM_QUERIES)}
    folder = write_beir_folder(tmp_path / "bulk", queries=queries, qrels={})
    wh = copy_of(base_warehouse, tmp_path / "killed")
    reference = copy_of(base_warehouse, tmp_path / "reference")

    def command(warehouse: str) -> list[str]:
        return ["query", "--warehouse", warehouse, "--queries", str(folder / "queries.jsonl.gz"), "--run-id", "bulk",
                "--out", f"{warehouse}.trec", "-k", "10", "--no-expand", "--commit-every", str(QUERY_COMMIT)]

    runs_uri = tables.table_uri(wh, tables.RUNS)
    log = tmp_path / "killed.log"
    kill_when(start_job(command(wh), log), log, lambda: table_version(runs_uri) is not None)
    committed = read_table(runs_uri, columns=["qid"])["qid"].to_pylist()
    assert 0 < len(committed) < NUM_QUERIES, "the job was not killed part-way"
    assert len(committed) % QUERY_COMMIT == 0  # whole commits only
    assert not Path(f"{wh}.trec").exists()  # the run files appear whole, when the run is complete
    # A new index version is published before the rerun (as the nightly build would): the resumed run must still
    # finish on the index its committed queries were scored on, not mix two indexes in one run.
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)

    # The rerun and the uninterrupted reference run in this process: the same job as `command` (the CLI's
    # encoder backend), without two more cold interpreter and Ray starts.
    def rerun(warehouse: str) -> dict:
        return query_job.run(query_job.QueryConfig(
            warehouse=warehouse, queries=str(folder / "queries.jsonl.gz"), run_id="bulk", out=Path(f"{warehouse}.trec"),
            k=10, expand=False, backend=BackendConfig(backend="encoder")))

    summary = rerun(wh)
    # Nothing redone: the rerun scores exactly the queries the killed job had not committed.
    assert (summary["scored"], summary["skipped"]) == (NUM_QUERIES - len(committed), len(committed))
    rerun(reference)

    def runs(warehouse: str) -> list[dict]:
        rows = read_table(tables.table_uri(warehouse, tables.RUNS)).to_pylist()
        return sorted(({c: r[c] for c in ("run_id", "qid", "query", "program", "doc_ids", "scores",
                                          "index_version")} for r in rows), key=lambda r: (r["run_id"], r["qid"]))

    resumed, expected = runs(wh), runs(reference)
    assert [(r["run_id"], r["qid"]) for r in resumed] == [("bulk", q) for q in sorted(queries)]  # one row each
    assert resumed == expected
    assert sum(bool(r["doc_ids"]) for r in resumed) > NUM_QUERIES // 2  # most queries match something
    assert Path(f"{wh}.trec").read_text() == Path(f"{reference}.trec").read_text()
    assert pq.read_table(f"{wh}.parquet").equals(pq.read_table(f"{reference}.parquet"))
    # Asked outright to go on with the run on another version, the job refuses (before any work).
    with pytest.raises(ValueError, match="scored on index v1, not v2"):
        query_job.run(query_job.QueryConfig(warehouse=wh, queries=str(folder / "queries.jsonl.gz"), run_id="bulk",
                                            out=tmp_path / "mixed.trec", expand=False, index_version=2))
