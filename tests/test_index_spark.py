"""Integration: the Spark index build into real Delta tables, read back without a JVM."""

import os
import subprocess
import sys
from collections import Counter

import pytest

from sira.jobs import index as index_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.storage.spark_session import local_scratch_dir, local_scratch_root
from sira.pipelines.index.catalog import find_index, published_versions
from sira.pipelines.serving.shard_loader import load_searcher
from sira.pipelines.index.context import replace_rows
from sira.core.analysis import Analyzer
from sira.core.memory_index import build_searcher, index_text
from sira.core.presets import get_preset

from conftest import TINY_DOCS, TINY_QUERIES

pytestmark = pytest.mark.integration


def test_versions_are_recorded_with_their_source_tables(tiny_warehouse):
    rows = published_versions(tiny_warehouse)
    assert [(r["index_version"], r["num_shards"], r["preset"]) for r in rows[:2]] == [(1, 1, "sira"), (2, 3, "sira")]
    assert all(r["docs_table_version"] == 0 and r["num_docs"] == len(TINY_DOCS) for r in rows)


def test_term_stats_match_the_analyzer(tiny_warehouse):
    analyzer = Analyzer(get_preset("sira").analyzer)
    df, cf = Counter(), Counter()
    for d in TINY_DOCS:
        counts = Counter(analyzer.terms(index_text(d["title"], d["text"])))
        df.update(counts.keys())
        cf.update(counts)
    stats = read_table(f"{tiny_warehouse}/term_stats", filters=[("index_version", "=", 2)]).to_pylist()
    assert {r["term"]: (r["df"], r["cf"]) for r in stats} == {t: (df[t], cf[t]) for t in df}
    manifest = find_index(tiny_warehouse, 2)
    assert manifest["total_terms"] == sum(cf.values())
    assert manifest["avgdl"] == pytest.approx(sum(cf.values()) / len(TINY_DOCS))


def test_sharded_spark_index_ranks_exactly_like_one_shard_and_the_reference(tiny_warehouse):
    one, _ = load_searcher(tiny_warehouse, 1)
    three, _ = load_searcher(tiny_warehouse, 2)
    assert len(three.shards) == 3 and sum(s.num_docs for s in three.shards) == len(TINY_DOCS)
    reference = build_searcher([(d["_id"], d["title"], d["text"]) for d in TINY_DOCS], get_preset("sira"), 2)
    for q in TINY_QUERIES.values():
        for k in (1, 3, 12):
            expected = [(h.doc_id, h.score) for h in reference.search(q, k=k)]
            assert [(h.doc_id, h.score) for h in one.search(q, k=k)] == expected
            assert [(h.doc_id, h.score) for h in three.search(q, k=k)] == expected


def test_a_half_written_version_is_invisible_and_replaced_by_the_next_build(tiny_warehouse, spark):
    latest = published_versions(tiny_warehouse)[-1]["index_version"]
    partial = latest + 1
    # Simulate a build killed after writing its segment's postings but before publishing corpus_stats.
    junk = spark.createDataFrame([(partial, 0, 123, 0, [0], [9])],
                                 "segment long, shard int, term_id long, block int, doc_ords array<int>, tfs array<int>")
    replace_rows(junk, f"{tiny_warehouse}/segment_postings", "segment", partial, ["segment", "shard"])
    assert find_index(tiny_warehouse)["index_version"] == latest

    row = index_job.run(index_job.IndexConfig(warehouse=tiny_warehouse, preset="pyserini-flat", shards=2), spark=spark)
    assert row["index_version"] == partial
    postings = read_table(f"{tiny_warehouse}/segment_postings", filters=[("segment", "=", partial)]).to_pylist()
    assert 123 not in {r["term_id"] for r in postings}
    searcher, manifest = load_searcher(tiny_warehouse, preset="pyserini-flat")
    assert manifest["index_version"] == partial and searcher.search("insulin", k=1)[0].doc_id == "d05"


def test_bad_preset_and_missing_docs_are_clear_errors(tmp_path, spark):
    with pytest.raises(ValueError, match="unknown preset 'bm99'"):
        index_job.run(index_job.IndexConfig(warehouse=str(tmp_path), preset="bm99"), spark=spark)
    with pytest.raises(FileNotFoundError, match="run `sira ingest` first"):
        index_job.run(index_job.IndexConfig(warehouse=str(tmp_path)), spark=spark)


def test_a_term_id_spelled_two_ways_is_a_clear_error(tmp_path, tiny_beir, spark):
    from sira.core.hashing import term_id
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.index.context import TermIdCollision

    wh = str(tmp_path / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    # The dictionary already spells the id of a word of the corpus otherwise (what a hash collision looks like).
    spark.createDataFrame([(term_id("insulin"), "not-insulin")], "term_id long, term string").write.format(
        "delta").save(f"{wh}/term_dictionary")
    with pytest.raises(TermIdCollision, match=r"\('insulin', 'not-insulin'\)"):
        index_job.run(index_job.IndexConfig(warehouse=wh, preset="pyserini-flat", shards=1), spark=spark)



def test_a_local_session_keeps_its_scratch_in_a_folder_of_its_own_and_removes_orphaned_ones(tmp_path, spark):
    assert spark.sparkContext.getConf().get("spark.local.dir") == str(local_scratch_root() / f"pid-{os.getpid()}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphaned = tmp_path / f"pid-{gone.stdout.strip()}" / "blockmgr-1"  # a killed job's persisted frames
    orphaned.mkdir(parents=True)
    running = tmp_path / f"pid-{os.getppid()}"
    running.mkdir()
    assert local_scratch_dir(tmp_path) == str(tmp_path / f"pid-{os.getpid()}")
    assert not orphaned.parent.exists() and running.exists()
