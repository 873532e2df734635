"""Integration: the corpus-side DF filter and injection inside the Spark index build (real Delta)."""

from collections import Counter
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from sira.jobs import index as index_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.serving.hit_details import version_injections
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.ray_enrich import commit
from sira.pipelines.index.catalog import find_index
from sira.pipelines.serving.shard_loader import load_searcher
from sira.core import tables
from sira.core.analysis import Analyzer
from sira.core.memory_index import index_text
from sira.core.presets import get_preset

from conftest import TINY_DOCS

pytestmark = pytest.mark.integration


def enrichment_rows(docs_table, phrases_by_doc, model="fake-llm", prompt_version="doc-generic-test", stale=()):
    hashes = dict(zip(docs_table["doc_id"].to_pylist(), docs_table["content_hash"].to_pylist()))
    rows = []
    for doc_id, phrases in phrases_by_doc.items():
        rows.append({"doc_id": doc_id, "content_hash": "stale" if doc_id in stale else hashes[doc_id], "model": model,
                     "prompt_version": prompt_version, "backend": "test", "phrases": phrases,
                     "raw_output": str(phrases), "input_tokens": 10, "output_tokens": 5, "latency_ms": 1.0,
                     "error": None, "enriched_at": datetime.now(timezone.utc)})
    return pa.Table.from_pylist(rows, schema=tables.ENRICHMENT_SCHEMA)


@pytest.fixture(scope="module")
def enriched_warehouse(tmp_path_factory, tiny_beir, spark):
    wh = str(tmp_path_factory.mktemp("enriched") / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    docs = read_table(f"{wh}/docs")
    commit(wh, enrichment_rows(docs, {
        "d02": ["myocardial infarction", "blood", "aspirin", "antiplatelet"],  # kept / too common / in doc / kept
        "d04": ["hyperglycemia", "hyperglycemia-related-hyperglycemia"],  # kept / repeats a word
        "d09": ["espresso"],  # stale: its content changed since it was enriched
    }, stale={"d09"}))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, tau=0.25), spark=spark)
    return wh


def test_decisions_are_recorded_with_their_reason(enriched_warehouse):
    manifest = find_index(enriched_warehouse, enriched=True)
    assert manifest["tau"] == 0.25 and manifest["phrases_proposed"] == 6 and manifest["phrases_kept"] == 3
    rows = version_injections(enriched_warehouse, manifest).to_pylist()
    got = {(r["doc_id"], r["phrase"]): (r["kept"], r["reason"]) for r in rows}
    assert got == {
        ("d02", "myocardial infarction"): (True, "kept"),
        ("d02", "blood"): (False, "too common"),   # "blood" is in 5 of 12 docs > 0.25 * 12
        ("d02", "aspirin"): (False, "in document"),
        ("d02", "antiplatelet"): (True, "kept"),
        ("d04", "hyperglycemia"): (True, "kept"),
        ("d04", "hyperglycemia-related-hyperglycemia"): (False, "repeats a word"),
    }


def test_injection_grows_doc_length_and_df_enriched(enriched_warehouse):
    analyzer = Analyzer(get_preset("sira").analyzer)
    plain = find_index(enriched_warehouse, enriched=False)
    enriched = find_index(enriched_warehouse, enriched=True)
    injected = Counter(analyzer.terms_of_phrases(["myocardial infarction", "antiplatelet"]))
    assert enriched["total_terms"] == plain["total_terms"] + sum(injected.values()) + len(analyzer.terms("hyperglycemia"))

    lens = {r["doc_id"]: r["doc_len"] for r in read_table(f"{enriched_warehouse}/segment_docs",
            filters=[("segment", "in", enriched["segments"])]).to_pylist()}
    d02 = next(d for d in TINY_DOCS if d["_id"] == "d02")
    assert lens["d02"] == len(analyzer.terms(index_text(d02["title"], d02["text"]))) + sum(injected.values())

    stats = {r["term"]: r for r in read_table(f"{enriched_warehouse}/term_stats",
             filters=[("index_version", "=", enriched["index_version"])]).to_pylist()}
    myocardi, infarct = analyzer.tokens("myocardial infarction")
    assert (stats[myocardi]["df"], stats[myocardi]["df_enriched"]) == (1, 2)      # d01 has it; d02 gains it
    assert (stats[f"{myocardi} {infarct}"]["df"], stats[f"{myocardi} {infarct}"]["df_enriched"]) == (1, 2)
    assert (stats["antiplatelet"]["df"], stats["antiplatelet"]["df_enriched"]) == (0, 1)
    assert "espresso" not in stats  # stale enrichment (content changed) is ignored


def test_enriched_index_finds_documents_by_their_new_vocabulary(enriched_warehouse):
    plain, _ = load_searcher(enriched_warehouse, enriched=False)
    enriched, _ = load_searcher(enriched_warehouse, enriched=True)
    assert "d02" not in {h.doc_id for h in plain.search("antiplatelet", k=5)}
    assert [h.doc_id for h in enriched.search("antiplatelet", k=5)] == ["d02"]
    assert {h.doc_id for h in enriched.search("hyperglycemia", k=5)} == {"d04"}


def test_eval_doc_variant_uses_the_enriched_index(enriched_warehouse, tiny_beir):
    from sira.jobs import eval as eval_job

    doc = eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=enriched_warehouse, variant="doc",
                                           tau=0.25, shards=2))
    plain = eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=enriched_warehouse, variant="bm25",
                                             shards=2))
    assert doc["index_version"] == find_index(enriched_warehouse, enriched=True)["index_version"]
    assert plain["index_version"] == find_index(enriched_warehouse, enriched=False)["index_version"]
    assert (doc["variant"], plain["variant"]) == ("doc", "bm25")
    assert set(doc["metrics"]) == {"ndcg@10", "recall@10", "recall@100"}


def test_an_enrichment_that_proposed_nothing_builds_an_enriched_index(tmp_path, tiny_beir, spark):
    # e.g. the encoder proposer over a corpus too small to leave it a vocabulary: every answer is empty
    wh = str(tmp_path / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    docs = read_table(f"{wh}/docs")
    commit(wh, enrichment_rows(docs, {doc_id: [] for doc_id in docs["doc_id"].to_pylist()}))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2), spark=spark)
    manifest = find_index(wh, preset="sira", enriched=True)
    assert manifest["phrases_kept"] == 0
