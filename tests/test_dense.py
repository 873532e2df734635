"""The dense baselines (sira.core.dense, sira.pipelines.enrichment.embeddings): exact inner-product search, reciprocal
rank fusion, the document vectors kept incrementally in Delta by the encoder's enrichment and by `embed_documents`,
and the dense, hybrid and sira+dense variants of `sira eval` (real Spark, Ray and Delta; the packaged encoder)."""

from __future__ import annotations

import numpy as np
import pytest

from sira.core import dense
from sira.core.dense import DenseIndex, reciprocal_rank_fusion


def brute_force(vectors, doc_ids, query, k, banned=None):
    scores = [(float(np.dot(query, v)), i) for i, v in enumerate(vectors) if doc_ids[i] != banned]
    return [(doc_ids[i], s) for s, i in sorted(scores, key=lambda si: (-si[0], si[1]))[:k]]


def test_dense_search_is_exact_across_blocks_and_leaves_a_query_its_own_document(monkeypatch):
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # unit rows, as the encoder makes them
    vectors[11] = vectors[3]  # a tie: the earlier row first
    doc_ids = [f"d{i:02d}" for i in range(50)]
    queries = rng.normal(size=(4, 8)).astype(np.float32)
    queries[0] = vectors[3]
    monkeypatch.setattr(dense, "DENSE_BLOCK_DOCS", 7)  # blocks smaller than k: the running top-k carries across
    index = DenseIndex(doc_ids, vectors)
    got = index.search(queries, 10)
    for q, hits in zip(queries, got):
        want = brute_force(vectors, doc_ids, q, 10)
        assert [d for d, _ in hits] == [d for d, _ in want]
        assert [s for _, s in hits] == pytest.approx([s for _, s in want], rel=1e-5)
    assert got[0][0][0] == "d03" and got[0][1][0] == "d11"
    excluded = index.search(queries, 10, exclude=["d03", None, "nope", doc_ids[0]])
    assert "d03" not in [d for d, _ in excluded[0]] and excluded[0][0][0] == "d11"
    assert [d for d, _ in excluded[1]] == [d for d, _ in got[1]]
    assert len(index.search(queries[:1], 500)[0]) == 50  # k past the corpus: every document once


def test_reciprocal_rank_fusion_adds_one_over_k_plus_rank():
    bm25 = {"q1": {"a": 9.0, "b": 5.0, "c": 1.0}, "q2": {}}
    vectors = {"q1": {"c": 0.9, "a": 0.8}, "q2": {"x": 0.5}}
    fused = reciprocal_rank_fusion([bm25, vectors], k=60)
    assert fused["q1"] == pytest.approx({"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62})
    assert list(fused["q1"]) == ["a", "c", "b"] and fused["q2"] == pytest.approx({"x": 1 / 61})
    assert list(reciprocal_rank_fusion([bm25, vectors], depth=1)["q1"]) == ["a"]


@pytest.fixture(scope="module")
def dense_warehouse(tmp_path_factory, tiny_beir, spark):
    from sira.jobs import enrich as enrich_job, index as index_job, ingest as ingest_job
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.core.proposers import EncoderProposerConfig

    wh = str(tmp_path_factory.mktemp("dense") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)
    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(proposals=4, vocabulary_tau=0.5))
    # The first 8 documents enriched (and so embedded) by the encoder proposer; the rest are left to embed_documents.
    enrich_job.run(enrich_job.EnrichConfig(warehouse=wh, backend=backend, commit_every=4, limit=8))
    return wh


@pytest.mark.integration
def test_the_encoders_enrichment_keeps_its_vectors_and_embedding_makes_only_the_rest(dense_warehouse, tmp_path):
    from sira.pipelines.enrichment.embeddings import embed_documents, encoder_id
    from sira.pipelines.enrichment.encoder_proposer import shared_encoder
    from sira.pipelines.storage.delta_io import read_table
    from sira.core.analysis import index_text
    from sira.core import tables

    uri = tables.table_uri(dense_warehouse, tables.DOC_EMBEDDINGS)
    assert read_table(uri).num_rows == 8
    calls = []
    summary = embed_documents(dense_warehouse, print, _bar(calls), commit_every=3)
    assert (summary["embedded"], summary["skipped"], summary["commits"]) == (4, 8, 2)
    rows = read_table(uri).to_pylist()
    assert len(rows) == 12 and {r["encoder"] for r in rows} == {encoder_id()}
    docs = {d["doc_id"]: d for d in read_table(tables.table_uri(dense_warehouse, tables.DOCS)).to_pylist()}
    assert {r["doc_id"] for r in rows} == set(docs) and all(r["content_hash"] == docs[r["doc_id"]]["content_hash"]
                                                           for r in rows)
    # Each vector is the encoder's vector of the document's text, whichever writer made it.
    texts = [index_text(docs[r["doc_id"]]["title"], docs[r["doc_id"]]["text"]) for r in rows]
    want = shared_encoder().encode(texts)
    assert np.allclose(np.array([r["embedding"] for r in rows]), want, atol=1e-5)
    again = embed_documents(dense_warehouse, print, _bar(calls))
    assert (again["embedded"], again["skipped"], again["commits"]) == (0, 12, 0)


def _bar(calls):
    from contextlib import contextmanager

    @contextmanager
    def progress(name, total, unit):
        calls.append((name, total))
        yield lambda n: None
    return progress


@pytest.mark.integration
def test_a_killed_embedding_keeps_its_commits_and_resumes_without_duplicates(tmp_path, tiny_beir, monkeypatch):
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.enrichment import embeddings
    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables

    wh = str(tmp_path / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    append = embeddings.append_embeddings
    commits = []

    def dies_on_the_third(warehouse, rows):
        if len(commits) == 2:
            raise RuntimeError("killed")
        commits.append(rows.num_rows)
        append(warehouse, rows)

    monkeypatch.setattr(embeddings, "append_embeddings", dies_on_the_third)
    with pytest.raises(RuntimeError, match="killed"):
        embeddings.embed_documents(wh, print, _bar([]), commit_every=5)
    monkeypatch.setattr(embeddings, "append_embeddings", append)
    assert read_table(tables.table_uri(wh, tables.DOC_EMBEDDINGS)).num_rows == 10
    resumed = embeddings.embed_documents(wh, print, _bar([]), commit_every=5)
    assert (resumed["embedded"], resumed["skipped"]) == (2, 10)
    ids = read_table(tables.table_uri(wh, tables.DOC_EMBEDDINGS))["doc_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 12


@pytest.mark.integration
def test_dense_hybrid_and_sira_plus_dense_variants(dense_warehouse, tiny_beir):
    from sira.jobs import eval as eval_job
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.core.metrics import read_trec_run
    from sira.core.proposers import EncoderProposerConfig

    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(proposals=4, vocabulary_tau=0.5))
    runs = {}
    for variant in ("bm25", "dense", "hybrid", "sira", "sira+dense"):
        summary = eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=dense_warehouse, variant=variant,
                                                   shards=2, tau=0.25, backend=backend, doc_backend=backend))
        assert set(summary["metrics"]) == {"ndcg@10", "recall@10", "recall@100"}
        runs[variant] = read_trec_run(summary["run_file"])
    assert all(0 < len(hits) <= 12 for hits in runs["dense"].values())  # every document scored: tiny corpus
    for fused, parts in (("hybrid", ("bm25", "dense")), ("sira+dense", ("sira", "dense"))):
        want = reciprocal_rank_fusion([runs[p] for p in parts])
        assert set(runs[fused]) == set(want)
        for qid, hits in runs[fused].items():
            assert hits == pytest.approx(want[qid], abs=2e-6)


@pytest.mark.integration
def test_the_dense_variant_with_bge_small_embeds_beside_the_default_encoder(dense_warehouse, tiny_beir):
    from sira.jobs import eval as eval_job
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.enrichment.encoder_proposer import shared_encoder
    from sira.pipelines.storage.delta_io import read_table
    from sira.core import tables
    from sira.core.analysis import index_text
    from sira.core.datasets import resolve_dataset
    from sira.core.metrics import read_trec_run
    from sira.core.proposers import EncoderProposerConfig

    uri = tables.table_uri(dense_warehouse, tables.DOC_EMBEDDINGS)
    before = read_table(uri).num_rows
    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(model="bge-small-en-v1.5"))
    summary = eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=dense_warehouse, variant="dense",
                                               backend=backend, shards=2))
    assert summary["run_file"].endswith("-dense-bge-small-en-v1.5.trec")  # beside the default encoder's run
    rows = read_table(uri).to_pylist()
    bge_rows = [r for r in rows if r["encoder"] == "bge-small-en-v1.5@256"]
    assert len(rows) == before + 12 and len(bge_rows) == 12  # the default encoder's vectors are left as they were
    # The run is exact search over bge's vectors, its queries read with bge's retrieval instruction.
    bge = shared_encoder(256, "bge-small-en-v1.5")
    docs = read_table(tables.table_uri(dense_warehouse, tables.DOCS)).to_pylist()
    ids = sorted(d["doc_id"] for d in docs)
    by_id = {d["doc_id"]: d for d in docs}
    index = DenseIndex(ids, bge.encode([index_text(by_id[i]["title"], by_id[i]["text"]) for i in ids]))
    queries = resolve_dataset(str(tiny_beir)).queries("test")
    want = dict(zip(queries, index.search(bge.encode_queries(list(queries.values())), 100)))
    for qid, hits in read_trec_run(summary["run_file"]).items():
        assert list(hits) == [d for d, _ in want[qid]]


def test_query_vectors_are_encoded_once_per_text(monkeypatch):
    from sira.pipelines.serving import dense_retriever

    class Counting:
        dim = 2

        def __init__(self):
            self.seen = []

        def encode_queries(self, texts):
            self.seen += list(texts)
            return np.array([[len(t), 1.0] for t in texts], np.float32)

    monkeypatch.setattr(dense_retriever, "_QUERY_VECTORS", {})
    encoder = Counting()
    first = dense_retriever.query_vectors(encoder, ["a", "bb", "a"])
    again = dense_retriever.query_vectors(encoder, ["bb", "ccc"])
    assert encoder.seen == ["a", "bb", "ccc"]  # a repeated or earlier text is not encoded again
    assert first[:, 0].tolist() == [1, 2, 1] and again[:, 0].tolist() == [2, 3]
    monkeypatch.setattr(dense_retriever, "QUERY_VECTOR_CACHE", 2)
    dense_retriever.query_vectors(encoder, ["dddd"])  # full: the cache starts over
    assert encoder.seen[-1] == "dddd" and len(dense_retriever._QUERY_VECTORS) == 1
