"""Integration: incremental index builds (a night's changed documents enter a new segment, the ones that left are
tombstoned) publish exactly what a full rebuild of the same corpus publishes: the same statistics, injection
decisions, shard arrays and rankings (real local Spark and Delta)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_DOCS, TINY_QUERIES, write_beir_folder
from sira.jobs import index as index_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.serving.hit_details import version_injections
from sira.pipelines.enrichment.ray_enrich import commit
from sira.pipelines.serving import shard_loader
from sira.pipelines.index.catalog import find_index
from sira.pipelines.index.config import SegmentPolicy
from sira.pipelines.serving.shard_loader import load_searcher, read_term_stats
from sira.core import tables
from sira.core.hashing import term_id
from test_index_enrichment import enrichment_rows

pytestmark = pytest.mark.integration

CHANGED = {"_id": "d03", "title": "Stroke", "text": "A stroke happens when a clot blocks blood flow to the brain."}
ADDED = [{"_id": "d13", "title": "Insulin pumps", "text": "An insulin pump delivers insulin under the skin."},
         {"_id": "d14", "title": "Type 1 diabetes", "text": "People with type 1 diabetes need insulin every day."}]
NIGHT_2 = [CHANGED if d["_id"] == "d03" else d for d in TINY_DOCS if d["_id"] != "d08"] + ADDED
# d12's "insulin" is in 2 of 12 documents on night 1 (kept under tau 0.25: limit 3) and in 4 of 13 on night 2 (too
# common: limit 3.25): its injection changes although its text does not, so it must move to the new segment.
PHRASES = {"d02": ["myocardial infarction", "blood", "antiplatelet"], "d04": ["hyperglycemia"],
           "d12": ["insulin", "glycemic control"], "d09": ["espresso"]}
TAU = 0.25


def ingest(wh: str, docs, tmp: Path, mode: str = "replace") -> None:
    source = tmp / f"snapshot-{len(docs)}-{mode}.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=wh, mode=mode))


def enrich(wh: str) -> None:
    docs = read_table(f"{wh}/docs")
    present = set(docs["doc_id"].to_pylist())
    commit(wh, enrichment_rows(docs, {d: p for d, p in PHRASES.items() if d in present}))


def build(wh: str, spark, **kw) -> dict:
    """`sira index` with IndexConfig's fields, and SegmentPolicy's (max_segments, ...) by name."""
    policy = {name: kw.pop(name) for name in list(kw) if name in SegmentPolicy.model_fields}
    return index_job.run(index_job.IndexConfig(**{"warehouse": wh, "preset": "sira", "shards": 2, "segments": policy,
                                                  **kw}), spark=spark)


def assert_same_index(wh: str, reference: str, enriched: bool) -> None:
    got, want = find_index(wh, enriched=enriched), find_index(reference, enriched=enriched)
    for field in ("num_docs", "avgdl", "total_terms", "num_terms", "phrases_proposed", "phrases_kept"):
        assert got[field] == want[field], field
    # An incremental version's term_stats rows are what moved; summed with its base's, they are the rebuild's.
    stats = lambda w, m: sorted(read_term_stats(w, m).to_pylist(), key=lambda r: r["term_id"])
    assert stats(wh, got) == stats(reference, want)
    assert len(stats(wh, got)) == got["num_terms"]
    if enriched:
        # The decisions of every document; min_df is the DF when a document's decisions were made (a later night that
        # moves DFs without changing a decision keeps the document where it is).
        rows = lambda w, m: sorted(json.dumps({k: v for k, v in r.items() if k != "min_df"}, sort_keys=True)
                                   for r in version_injections(w, m).to_pylist())
        assert rows(wh, got) == rows(reference, want)
    ours, _ = load_searcher(wh, got["index_version"])
    theirs, _ = load_searcher(reference, want["index_version"])
    for a, b in zip(ours.shards, theirs.shards):
        for name in ("doc_ids", "doc_lens", "term_ids", "indptr", "doc_ords", "impacts"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), f"shard {a.shard}: {name}"
    for q in [*TINY_QUERIES.values(), "insulin", "glycemic control", "antiplatelet", "clot"]:
        assert [(h.doc_id, h.score) for h in ours.search(q, k=20)] == \
               [(h.doc_id, h.score) for h in theirs.search(q, k=20)], q


def after_night(nights, night: int, to: Path) -> str:
    """A copy at `to` of the nights fixture's warehouse as it was after night 1 or 2 (plain and enriched builds
    published), for a test that goes on from there: the copy's own path keys its shard cache."""
    return str(shutil.copytree(Path(nights[0]).parent / f"after-night-{night}", to))


@pytest.fixture(scope="module")
def nights(tmp_path_factory, spark):
    """Night 1 (full builds, plain and enriched), then night 2's changes built incrementally; and a reference
    warehouse that holds night 2's corpus from scratch. The warehouse is also kept as it was after each night
    (`after_night`), since tests here change it."""
    tmp = tmp_path_factory.mktemp("incremental")
    wh, reference = str(tmp / "wh"), str(tmp / "reference")
    ingest(wh, TINY_DOCS, tmp)
    enrich(wh)
    first = {"plain": build(wh, spark, enrichment=False), "enriched": build(wh, spark, enrichment=True, tau=TAU)}
    shutil.copytree(wh, tmp / "after-night-1")
    ingest(wh, NIGHT_2, tmp, mode="merge")
    enrich(wh)
    second = {"plain": build(wh, spark, enrichment=False), "enriched": build(wh, spark, enrichment=True, tau=TAU)}
    shutil.copytree(wh, tmp / "after-night-2")
    ingest(reference, NIGHT_2, tmp)
    enrich(reference)
    build(reference, spark, enrichment=False)
    build(reference, spark, enrichment=True, tau=TAU)
    return wh, reference, first, second


def test_a_night_analyses_only_new_and_changed_documents(nights):
    _, _, first, second = nights
    assert first["plain"]["documents_analysed"] == len(TINY_DOCS)
    assert first["enriched"]["documents_analysed"] == 0  # the plain build's analysis is kept and reused
    assert second["plain"]["documents_analysed"] == 3  # d03 changed, d13 and d14 added
    assert second["enriched"]["documents_analysed"] == 0
    # The night's changes came from the docs table's change data feed (the MERGE of night 2), not a comparison.
    assert not first["plain"]["changes_from_feed"]
    assert second["plain"]["changes_from_feed"] and second["enriched"]["changes_from_feed"]


def test_a_night_adds_a_segment_and_tombstones_what_left(nights):
    wh, _, first, second = nights
    plain, enriched = second["plain"], second["enriched"]
    assert plain["segments"] == [first["plain"]["index_version"], plain["index_version"]]
    assert plain["base_version"] == first["plain"]["index_version"]
    assert plain["num_tombstones"] == 2  # d03's old text, d08
    segment = read_table(f"{wh}/segment_docs", filters=[("segment", "=", plain["index_version"])])
    assert sorted(segment["doc_id"].to_pylist()) == ["d03", "d13", "d14"]
    # The enriched night also moves d12, whose "insulin" became too common (its text is unchanged).
    assert enriched["num_tombstones"] == 3
    segment = read_table(f"{wh}/segment_docs", filters=[("segment", "=", enriched["index_version"])])
    assert sorted(segment["doc_id"].to_pylist()) == ["d03", "d12", "d13", "d14"]


@pytest.mark.parametrize("enriched", [False, True], ids=["plain", "enriched"])
def test_an_incremental_build_equals_a_full_rebuild(nights, enriched):
    wh, reference, _, _ = nights
    assert_same_index(wh, reference, enriched)
    decisions = {r["phrase"]: r["reason"] for r in version_injections(wh, find_index(wh, enriched=True), ["d12"])
                 .to_pylist()}
    assert decisions == {"insulin": "too common", "glycemic control": "kept"}


# Night 3: d13 goes, so "insulin" is in 3 of 12 documents (within tau 0.25 again: limit 3) and d12's phrase is kept
# once more; d09 is enriched again (another model, newer) with its content unchanged.
NIGHT_3 = [d for d in NIGHT_2 if d["_id"] != "d13"]
D09_AGAIN = {"d09": ["caffeine metabolism", "adenosine"]}


def enrich_d09_again(wh: str) -> None:
    commit(wh, enrichment_rows(read_table(f"{wh}/docs"), D09_AGAIN, model="fake-llm-2"))


@pytest.fixture(scope="module")
def night_3_rebuilt(tmp_path_factory, spark) -> str:
    """Night 3's corpus (d09 enriched again) built from scratch, plain and enriched: what night 3 must equal."""
    tmp = tmp_path_factory.mktemp("night-3")
    again = str(tmp / "again")
    ingest(again, NIGHT_3, tmp)
    enrich(again)
    enrich_d09_again(again)
    build(again, spark, enrichment=False)
    build(again, spark, enrichment=True, tau=TAU)
    return again


def test_enriched_nights_in_a_row_decide_only_what_can_change_and_equal_rebuilds(nights, night_3_rebuilt, tmp_path,
                                                                                spark):
    """Three enriched nights on one warehouse: a phrase kept, dropped as too common (its DF crossed tau x |C|) and
    kept again, and a document enriched again without a change of content; each night equals a rebuild. Nights 1
    and 2 are the nights fixture's (test_an_incremental_build_equals_a_full_rebuild checks night 2 against its
    rebuild); this test goes on from a copy of the warehouse after night 2."""
    _, _, _, nights_built = nights
    second = nights_built["enriched"]
    d12 = lambda w: {r["phrase"]: r["reason"] for r in version_injections(  # noqa: E731
        w, find_index(w, enriched=True), ["d12"]).to_pylist()}
    assert d12(after_night(nights, 1, tmp_path / "night-1")) == {"insulin": "kept", "glycemic control": "kept"}
    wh = after_night(nights, 2, tmp_path / "wh")
    assert second["base_version"] is not None and d12(wh)["insulin"] == "too common"
    ingest(wh, NIGHT_3, tmp_path, mode="merge")
    enrich(wh)
    enrich_d09_again(wh)
    build(wh, spark, enrichment=False)
    third = build(wh, spark, enrichment=True, tau=TAU, max_dead_fraction=0.5)  # 6 of 18 tombstoned: still a night
    assert third["base_version"] == second["index_version"] and third["changes_from_feed"]
    assert d12(wh)["insulin"] == "kept"
    # d12 (its decision back) and d09 (its new enrichment) enter again; d13 went. Nothing else moves.
    entered = read_table(f"{wh}/segment_docs", filters=[("segment", "=", third["index_version"])])
    assert sorted(entered["doc_id"].to_pylist()) == ["d09", "d12"]
    assert_same_index(wh, night_3_rebuilt, enriched=True)
    assert {r["phrase"] for r in version_injections(wh, find_index(wh, enriched=True), ["d09"]).to_pylist()} == \
        set(D09_AGAIN["d09"])


def test_a_night_writes_only_the_term_statistics_that_moved(nights):
    wh, _, first, second = nights
    for kind in ("plain", "enriched"):
        assert second[kind]["term_stats_versions"] == [first[kind]["index_version"], second[kind]["index_version"]]
        assert first[kind]["term_stats_versions"] == [first[kind]["index_version"]]
    moved = read_table(f"{wh}/term_stats", filters=[("index_version", "=", second["plain"]["index_version"])])
    whole = read_table(f"{wh}/term_stats", filters=[("index_version", "=", first["plain"]["index_version"])])
    assert 0 < moved.num_rows < whole.num_rows / 2
    # d08 left: "sleep" (in no other document) is a change of -1 and no longer a term of the version.
    before = {r["term_id"]: r for r in whole.to_pylist()}[term_id("sleep")]
    sleep = {r["term_id"]: r for r in moved.to_pylist()}[term_id("sleep")]
    assert before["df"] == 1 and (sleep["df"], sleep["df_enriched"], sleep["cf"]) == (-1, -1, -before["cf"])
    assert term_id("sleep") not in read_term_stats(wh, find_index(wh, second["plain"]["index_version"]))["term_id"].to_pylist()


def test_a_searcher_opens_a_night_by_reading_only_what_the_night_wrote(nights, tmp_path, monkeypatch):
    """The local cache keeps each segment and each term-statistics version: a searcher that has opened night 1
    opens night 2 by reading from Delta only night 2's segment, tombstones and statistics, and assembles the same
    shards as a searcher with no cache at all (which version to open comes from corpus_stats, as always)."""
    wh, _, first, second = nights
    reads = []
    real = shard_loader.read_table
    monkeypatch.setattr(shard_loader, "read_table", lambda uri, version=None, filters=None, columns=None: (
        reads.append((uri.rsplit("/", 1)[-1], filters)) or real(uri, version, filters, columns)))
    for kind in ("plain", "enriched"):
        v1, v2 = first[kind]["index_version"], second[kind]["index_version"]
        monkeypatch.setenv("SIRA_SHARD_CACHE", str(tmp_path / kind / "following"))
        load_searcher(wh, v1)
        reads.clear()
        followed, _ = load_searcher(wh, v2)
        assert sorted({(table, None if table == "tombstones" else tuple(
            (c, op, tuple(v) if isinstance(v, list) else v) for c, op, v in f)) for table, f in reads if table != "corpus_stats"}, key=str) == sorted({
            ("segment_docs", (("segment", "=", v2), ("shard", "=", 0))),
            ("segment_docs", (("segment", "=", v2), ("shard", "=", 1))),
            ("segment_postings", (("segment", "=", v2), ("shard", "=", 0))),
            ("segment_postings", (("segment", "=", v2), ("shard", "=", 1))),
            ("tombstones", None), ("term_stats", (("index_version", "in", (v2,)),))}, key=str)
        monkeypatch.setenv("SIRA_SHARD_CACHE", str(tmp_path / kind / "cold"))
        cold, _ = load_searcher(wh, v2)
        for a, b in zip(followed.shards, cold.shards):
            for name, array in a.arrays().items():
                assert np.array_equal(array, b.arrays()[name]), f"{kind} shard {a.shard}: {name}"


# Between night 1 and night 2: d05 changes (its words leave, "zebrafish" comes) and d08 goes; night 2 then brings
# d05's text back (its kept analysis is reused), so some terms leave and come back across the chained versions.
MIDNIGHT = [{**d, "text": "Zebrafish regenerate heart tissue."} if d["_id"] == "d05" else d for d in TINY_DOCS
            if d["_id"] != "d08"] + ADDED[:1]


def test_term_statistics_chain_over_nights_and_are_written_whole_past_the_limit(nights, tmp_path, spark):
    _, reference, _, _ = nights
    wh = str(tmp_path / "wh")
    ingest(wh, TINY_DOCS, tmp_path)
    versions = [build(wh, spark, enrichment=False)["index_version"]]
    for night in (MIDNIGHT, NIGHT_2):
        ingest(wh, night, tmp_path, mode="merge")
        versions.append(build(wh, spark, enrichment=False, max_term_stats_versions=3)["index_version"])
    assert find_index(wh)["term_stats_versions"] == versions
    assert term_id("zebrafish") in read_table(f"{wh}/term_stats", filters=[("index_version", "=", versions[1])])[
        "term_id"].to_pylist()
    assert_same_index(wh, reference, enriched=False)
    # A fourth would make four: this build writes its statistics whole, and they are still the rebuild's.
    row = build(wh, spark, enrichment=False, max_term_stats_versions=3)
    assert row["term_stats_versions"] == [row["index_version"]] and len(row["segments"]) == 3
    assert_same_index(wh, reference, enriched=False)


def test_past_the_segment_limit_a_night_merges_the_small_segments_into_its_own(nights, night_3_rebuilt, tmp_path,
                                                                              spark):
    """At most 2 segments: night 2 merges the midnight segment (d13 still live in it) into its new segment instead
    of rebuilding in full; the merged segment leaves the version with its tombstones, its document keeps its
    analysis, injections and decisions, and the index equals a rebuild's. Night 3 (3 allowed) then deletes d13
    from the merged segment. Goes on from a copy of the nights fixture's warehouse after night 1."""
    _, reference, first, _ = nights
    wh, again = after_night(nights, 1, tmp_path / "wh"), night_3_rebuilt
    rows = {kind: [first[kind]] for kind in ("plain", "enriched")}
    for night, limit in ((MIDNIGHT, 2), (NIGHT_2, 2), (NIGHT_3, 3)):
        ingest(wh, night, tmp_path, mode="merge")
        enrich(wh)
        if night is NIGHT_3:
            enrich_d09_again(wh)  # as night_3_rebuilt has it
        policy = {"max_segments": limit, "merge_below_fraction": 0.5, "max_dead_fraction": 0.5}
        rows["plain"].append(build(wh, spark, enrichment=False, **policy))
        rows["enriched"].append(build(wh, spark, enrichment=True, tau=TAU, **policy))
        if night is NIGHT_2:
            assert_same_index(wh, reference, enriched=False)
            assert_same_index(wh, reference, enriched=True)
    for kind, (full, midnight, merged, third) in rows.items():
        assert midnight["segments"] == [full["index_version"], midnight["index_version"]]
        # Night 2: the midnight segment merged (not a full build: the base's big segment stays, tombstones and all).
        assert merged["base_version"] == midnight["index_version"] and merged["changes_from_feed"]
        assert merged["segments"] == [full["index_version"], merged["index_version"]]
        held = read_table(f"{wh}/segment_docs", filters=[("segment", "=", merged["index_version"])])
        assert "d13" in held["doc_id"].to_pylist()
        dead = read_table(f"{wh}/tombstones", filters=[("index_version", "=", merged["index_version"])])
        assert set(dead["segment"].to_pylist()) == {full["index_version"]}
        # Night 3: d13 leaves the merged segment, a tombstone there (and only the enriched night has documents
        # entering: d12's decision moves back).
        assert third["base_version"] == merged["index_version"]
        assert third["segments"] == [full["index_version"], merged["index_version"],
                                     *([third["index_version"]] if kind == "enriched" else [])]
        dead = read_table(f"{wh}/tombstones", filters=[("index_version", "=", third["index_version"]),
                                                       ("segment", "=", merged["index_version"])])
        where = {(r["shard"], r["doc_ord"]): r["doc_id"] for r in held.to_pylist()}
        assert "d13" in {where[(r["shard"], r["doc_ord"])] for r in dead.to_pylist()}
    assert_same_index(wh, again, enriched=False)
    assert_same_index(wh, again, enriched=True)
    # Too many dead documents for the policy, even with the small segments merged: every segment merges (the
    # documents keep their decisions; nothing is analysed or decided again), with the same index.
    for kind, enriched in (("plain", False), ("enriched", True)):
        row = build(wh, spark, enrichment=enriched, **({"tau": TAU} if enriched else {}), max_dead_fraction=0.01)
        assert row["segments"] == [row["index_version"]] and row["num_tombstones"] == 0
        assert row["base_version"] == rows[kind][-1]["index_version"] and row["documents_analysed"] == 0
        assert_same_index(wh, again, enriched=enriched)


def test_a_full_build_on_request_writes_one_segment_with_the_same_index(nights, spark):
    wh, reference, _, _ = nights
    row = build(wh, spark, enrichment=False, full=True)
    assert row["segments"] == [row["index_version"]] and row["num_tombstones"] == 0
    assert row["documents_analysed"] == 0
    assert_same_index(wh, reference, enriched=False)


def test_a_night_without_a_change_feed_compares_tables_and_equals_a_full_rebuild(nights, tmp_path, spark):
    """Night 2 as a rewrite of the docs table (a replace-mode ingest: no MERGE, so no change data feed to read): the
    incremental build finds what came and went by comparing the table with its base, with the same index; then
    at most one segment merges both into a new one (a compaction: no tombstones, the same index)."""
    _, reference, _, _ = nights
    wh = str(tmp_path / "wh")
    ingest(wh, TINY_DOCS, tmp_path)
    build(wh, spark, enrichment=False)
    ingest(wh, NIGHT_2, tmp_path)
    night = build(wh, spark, enrichment=False)
    assert night["base_version"] is not None and not night["changes_from_feed"]
    assert night["documents_analysed"] == 3
    assert_same_index(wh, reference, enriched=False)
    row = build(wh, spark, enrichment=False, max_segments=1)
    assert row["segments"] == [row["index_version"]] and row["base_version"] == night["index_version"]
    assert row["num_tombstones"] == 0 and row["documents_analysed"] == 0
    assert_same_index(wh, reference, enriched=False)
    searcher, _ = load_searcher(wh)
    assert [h.doc_id for h in searcher.search("insulin pump", k=1)] == ["d13"]


def test_a_corpus_whose_every_document_holds_one_term_is_indexed_in_bounded_rows(tmp_path, spark):
    """No postings row holds more than one block of documents, however common the term."""
    docs = [{"_id": f"c{i:05d}", "title": "", "text": f"common word{i % 7} filler{i % 13}"} for i in range(2500)]
    folder = write_beir_folder(tmp_path / "common", docs=docs, queries={"q": "common"}, qrels={"q": {"c00001": 1}})
    wh = str(tmp_path / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(folder), warehouse=wh))
    original = tables.POSTINGS_BLOCK_DOCS
    tables.POSTINGS_BLOCK_DOCS = 1000  # the build reads it at run time; 2,500 documents make 3 blocks
    try:
        row = build(wh, spark, enrichment=False, shards=1)
    finally:
        tables.POSTINGS_BLOCK_DOCS = original
    postings = read_table(f"{wh}/segment_postings", filters=[("segment", "=", row["index_version"])]).to_pylist()
    assert max(len(r["doc_ords"]) for r in postings) == 1000
    common = sorted((r["block"], len(r["doc_ords"])) for r in postings if r["term_id"] == term_id("common"))
    assert common == [(0, 1000), (1, 1000), (2, 500)]
    searcher, manifest = load_searcher(wh)
    assert manifest["num_docs"] == 2500
    hits = searcher.search("common", k=2500)
    assert len(hits) == 2500 and [h.doc_id for h in hits[:2]] == ["c00000", "c00001"]


SMALL_HEAP = "spark.driver.memory=512m"  # Spark's smallest: 300 MB reserved, about 125 MB for execution and storage


def test_a_term_in_every_document_builds_under_a_small_heap(tmp_path):
    """`sira ingest` and `sira index` as a user runs them, in their own JVM with a 512 MB heap, on 150,000
    documents that all hold one term (its postings: 3 blocks in each of 2 shards)."""
    import os
    import subprocess
    import sys

    n = 150_000
    source = tmp_path / "common.jsonl"
    with source.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"_id": f"c{i:06d}", "text": f"common word{i % 5003} other{i % 101}"}) + "\n")
    wh = str(tmp_path / "wh")
    env = {**os.environ, "SIRA_SPARK_CONF": SMALL_HEAP}
    for args in (["ingest", str(source), "-w", wh],
                 ["index", "-w", wh, "--preset", "pyserini-flat", "--shards", "2", "--no-enrichment"]):
        proc = subprocess.run([sys.executable, "-m", "sira.jobs.cli", *args], env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = find_index(wh)
    assert manifest["num_docs"] == n
    postings = read_table(f"{wh}/segment_postings", columns=["term_id", "block", "doc_ords"],
                          filters=[("term_id", "=", term_id("common"))])
    lengths = [len(o) for o in postings["doc_ords"].to_pylist()]
    assert sum(lengths) == n and max(lengths) <= tables.POSTINGS_BLOCK_DOCS  # 2 shards x 3 blocks
    assert len(lengths) == 2 * -(-n // 2 // tables.POSTINGS_BLOCK_DOCS)


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_stale_analyses_are_compacted_and_a_build_that_needed_one_is_built_in_full(nights, tmp_path, spark,
                                                                                   monkeypatch, mode):
    """A night read from the change feed (merge) analyses what went from the feed's texts, so the enriched build
    stays incremental after the plain one compacted those analyses away; one that compares whole tables (a rewrite
    of the docs table) needs them, finds them gone and builds in full. Both equal the rebuild."""
    from sira.pipelines.index import build as index_build

    _, reference, _, _ = nights
    monkeypatch.setattr(index_build, "STALE_ANALYSIS_FRACTION", 0.1)
    wh = after_night(nights, 1, tmp_path / "wh")  # night 1 leaves nothing stale to compact
    ingest(wh, NIGHT_2, tmp_path, mode=mode)
    enrich(wh)
    plain = build(wh, spark, enrichment=False)  # 2 stale analyses (d03's old text, d08) > 0.1 * 13: compacted
    kept = read_table(f"{wh}/doc_analysis", columns=["doc_id"])["doc_id"].to_pylist()
    assert sorted(kept) == sorted(d["_id"] for d in NIGHT_2)
    assert plain["base_version"] is not None  # this one was incremental: it compacted after publishing
    enriched = build(wh, spark, enrichment=True, tau=TAU)  # its base holds d08, whose analysis is gone
    if mode == "merge":
        assert enriched["base_version"] is not None and enriched["changes_from_feed"]
    else:
        assert enriched["base_version"] is None and enriched["segments"] == [enriched["index_version"]]
    assert_same_index(wh, reference, enriched=True)


def test_a_plain_night_analyses_what_went_from_the_change_feed_not_from_kept_analyses(nights, tmp_path, spark):
    """The terms a plain night takes out of the statistics come from the texts the change feed holds of what went,
    analysed again: the build stays incremental and exact without those documents' kept analyses."""
    from deltalake import DeltaTable

    _, reference, _, _ = nights
    wh = str(tmp_path / "wh")
    ingest(wh, TINY_DOCS, tmp_path)
    build(wh, spark, enrichment=False)
    DeltaTable(f"{wh}/doc_analysis").delete("doc_id = 'd03' OR doc_id = 'd08'")  # the two whose content goes
    ingest(wh, NIGHT_2, tmp_path, mode="merge")
    night = build(wh, spark, enrichment=False)
    assert night["base_version"] is not None and night["changes_from_feed"] and night["documents_analysed"] == 3
    assert_same_index(wh, reference, enriched=False)


def test_the_change_feed_nets_several_nights_into_what_came_and_went(tmp_path, spark):
    """Three MERGEs after the base's docs version: what came and went is the net change, whatever happened in
    between (changed twice, changed back, deleted and re-inserted as it was, inserted and deleted)."""
    from sira.core.presets import get_preset
    from sira.pipelines.storage.delta_io import has_change_data
    from sira.pipelines.index.build import start_build
    from sira.pipelines.index.changes import docs_changes

    doc = lambda i, text: {"_id": i, "title": "", "text": text}  # noqa: E731
    nights = [
        [doc("a", "one"), doc("b", "two"), doc("c", "three"), doc("d", "four")],
        [doc("a", "one"), doc("b", "two, changed"), doc("d", "four"), doc("e", "five")],  # b changed, c gone, e came
        [doc("a", "one"), doc("b", "two"), doc("c", "three"), doc("d", "four, changed")],  # b and c as before, e gone
        [doc("a", "one"), doc("b", "two"), doc("c", "three"), doc("d", "four, again"), doc("f", "six")],
    ]
    wh = str(tmp_path / "wh")
    for i, docs in enumerate(nights):
        ingest(wh, docs, tmp_path, mode="merge" if i else "replace")
    assert has_change_data(f"{wh}/docs", 0, 3) and not has_change_data(f"{wh}/docs", -1, 3)
    b = start_build(spark, wh, get_preset("sira"), 1, None, log=lambda _: None)
    changes = docs_changes(b, {"docs_table_version": 0, "num_docs": 4})
    rows = sorted((r["doc_id"], r["sign"], r["text"]) for r in changes.rows.collect())
    assert rows == [("d", -1, "four"), ("d", 1, "four, again"), ("f", 1, "six")]  # d as it was, and as it is
    assert (changes.came, changes.went, changes.num_docs) == (2, 1, 5)
    # A count that does not add up (a base that is not what the feed starts from) is not trusted.
    assert docs_changes(b, {"docs_table_version": 0, "num_docs": 3}) is None
    assert docs_changes(b, {"docs_table_version": 3, "num_docs": 5}).came == 0
    b.release()


def test_the_segment_policy_merges_nothing_within_it_then_the_small_segments_then_every_segment():
    from sira.pipelines.index.segments import _segments_to_merge

    policy = SegmentPolicy(max_segments=16, max_dead_fraction=0.25, merge_below_fraction=0.1)
    nights = {s: 1000 if s == 1 else 10 for s in range(1, 17)}  # a big segment and 15 nights' small ones
    assert _segments_to_merge({1: 1000, 2: 10, 3: 10}, {}, 10, policy) == []
    # A 17th segment would pass max_segments: the 15 small ones merge into the new one.
    assert _segments_to_merge(nights, {1: 100}, 10, policy) == list(range(2, 17))
    # Too many dead documents left in the big one even then: every segment merges.
    assert _segments_to_merge(nights, {1: 400}, 10, policy) == list(range(1, 17))
    assert _segments_to_merge({1: 1000}, {1: 300}, 0, policy) == [1]
