"""The encoder proposer: the packaged all-MiniLM-L6-v2 on numpy, the vocabulary, the nearest-entry contract,
the Delta vocabulary cache, and both sides through the real jobs (Spark, Ray, Delta)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from sira.core.analysis import Analyzer
from sira.core.presets import get_preset
from sira.core.proposers import (EncoderProposerConfig, Vocabulary, nearest_entries, surface_forms,
                                 vocabulary_entries)


@pytest.fixture(scope="module")
def encoder():
    from sira.pipelines.enrichment.encoder_proposer import shared_encoder

    return shared_encoder()


def test_encoder_reproduces_published_sentence_transformers_scores(encoder):
    # The cosine scores printed for all-MiniLM-L6-v2 in the sentence-transformers documentation
    # (semantic textual similarity example), reproduced by the numpy forward pass.
    pairs = [("A man is eating food.", "A man is eating a piece of bread.", 0.7553),
             ("A man is riding a horse.", "A man is riding a white horse on an enclosed ground.", 0.7369),
             ("A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums.", 0.6433),
             ("The new movie is awesome", "The new movie is so great", 0.8939)]
    a = encoder.encode([p[0] for p in pairs])
    b = encoder.encode([p[1] for p in pairs])
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert np.allclose((a * b).sum(1), [p[2] for p in pairs], atol=6e-4)


def test_encoder_is_deterministic_and_independent_of_batching(encoder):
    texts = ["insulin resistance", "a much longer text about blood pressure and heart disease risk factors", "x"]
    together = encoder.encode(texts)
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert np.array_equal(encoder.encode(texts), together)
    assert encoder.encode([]).shape == (0, encoder.dim)


def test_vocabulary_entries_bounds_and_surface_forms():
    analyzer = Analyzer(get_preset("sira").analyzer)
    texts = ["Running runners run", "The runner ran 2024 races", "Heart attack", "heart attacks kill", "cats", "cat"]
    forms = surface_forms(texts, analyzer, bigrams=True)
    term_dfs = Counter(t for text in texts for t in set(analyzer.terms(text)))
    uni = vocabulary_entries(term_dfs, forms, len(texts), EncoderProposerConfig(vocabulary_tau=0.34, entries="unigram"))
    by_term = {e.term: e for e in uni}
    assert "2024" not in by_term  # no letters
    assert all(1 <= e.df <= 0.34 * len(texts) for e in uni)
    assert by_term["cat"].surface == "cat"  # a tie between "cats" and "cat" goes to the smaller string
    assert all(" " not in e.term for e in uni)
    bi = vocabulary_entries(term_dfs, forms, len(texts), EncoderProposerConfig(vocabulary_tau=0.34, entries="bigram"))
    bigrams = {e.term: e for e in bi if " " in e.term}
    assert set(bigrams) == {"heart attack"} and bigrams["heart attack"].df == 2  # min_bigram_df 2
    assert [e.term for e in bi] == sorted(e.term for e in bi)


def _toy_vocabulary():
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    terms = ["aspirin", "insulin", "glucos", "heart attack", "stroke", "statin"]
    return Vocabulary(terms, ["aspirin", "insulin", "glucose", "heart attack", "stroke", "statins"],
                      np.ones(6, dtype=np.int64), vectors)


def test_nearest_entries_contract():
    vocab = _toy_vocabulary()
    texts = np.stack([vocab.vectors[1] + 0.1 * vocab.vectors[2], vocab.vectors[3]])
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    held = [{"insulin"}, {"heart", "attack"}]  # the second text holds both words of the bigram entry
    cfg = EncoderProposerConfig(proposals=3, min_similarity=-1.0)
    out = nearest_entries(texts, held, vocab, cfg)
    assert [len(p.phrases) for p in out] == [3, 3]
    assert "insulin" not in out[0].phrases and "heart attack" not in out[1].phrases  # never what the text holds
    sims = texts @ vocab.vectors.T
    for row, held_terms, p in zip(sims, [{"insulin"}, {"heart attack"}], out):  # nearest first, held ones skipped
        expected = [vocab.surfaces[i] for i in np.argsort(-row, kind="stable") if vocab.terms[i] not in held_terms]
        assert p.phrases == expected[:3]
    for p in out:
        assert all(0 < w <= 1 for w in p.weights)
        assert p.weights == sorted(p.weights, reverse=True)
    strict = nearest_entries(texts, held, vocab, EncoderProposerConfig(proposals=5, min_similarity=0.5))
    for row, p in zip(sims, strict):
        assert all(row[vocab.surfaces.index(s)] >= 0.5 for s in p.phrases)
    assert nearest_entries(texts, held, vocab, cfg) == out  # deterministic


def test_config_version_changes_with_settings():
    a = EncoderProposerConfig()
    assert a.version() == EncoderProposerConfig().version()
    assert a.version() != EncoderProposerConfig(proposals=a.proposals + 1).version()
    assert a.version() != EncoderProposerConfig(model="bge-small-en-v1.5").version()


def test_selection_harness_runs_its_grid_on_a_train_split(tiny_beir, tmp_path):
    # bench/select_encoder_proposer.py chose the defaults above; it went unrun (and broken) for months, so a small
    # grid runs here: BM25 first, then each combination that can differ, every row scored.
    import subprocess
    import sys
    from pathlib import Path

    def select(*options: str) -> dict:
        out = tmp_path / "selection.json"
        subprocess.run([sys.executable, "bench/select_encoder_proposer.py", "--dataset", str(tiny_beir), "--split",
                        "train", "--cache", str(tmp_path / "cache"), "--entries", "unigram", "--tau", "0.5", *options,
                        "--output-json", str(out)],
                       cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=300)
        return json.loads(out.read_text())

    report = select("--doc-n", "0,2", "--query-n", "0,2", "--w", "0.25,0.5", "--min-similarity", "0.2,0.5")
    rows = report["results"]
    assert rows[0]["name"] == "bm25" and report["split"] == "train" and report["encoder"] == "all-MiniLM-L6-v2"
    # plain again (one row), doc side alone (2 floors), query side alone (2 w x 2 floors), both (2 w x 2 floors)
    sides = [(r["doc_n"], r["query_n"]) for r in rows[1:]]
    assert sides.count((0, 0)) == 1 and sides.count((2, 0)) == 2 and len(rows) == 1 + 1 + 2 + 4 + 4
    assert all(0 <= r["ndcg@10"] <= 1 and "p_value" in r for r in rows[1:])
    assert report["best"] in rows[1:]
    # Two settings tested against each other, not against BM25.
    one = {"doc_n": 2, "query_n": 2, "entries": "unigram", "tau": 0.5, "w": 0.5, "min_similarity": 0.2}
    paired = select("--baseline", json.dumps(one), "--only", json.dumps({**one, "w": 0.25}))["results"]
    assert [r.get("name") for r in paired] == ["baseline", None] and paired[1]["w"] == 0.25
    assert paired[0]["ndcg@10"] == next(r for r in rows if r["doc_n"] == r["query_n"] == 2 and r["w"] == 0.5
                                        and r["min_similarity"] == 0.2)["ndcg@10"]


# ------------------------------------------------------------------ through the jobs (Spark, Ray, Delta) ------------


@pytest.fixture(scope="module")
def encoder_warehouse(tmp_path_factory, tiny_beir, spark):
    from sira.jobs import index as index_job
    from sira.jobs import ingest as ingest_job

    wh = str(tmp_path_factory.mktemp("encoder") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)
    return wh


@pytest.mark.integration
def test_enrich_with_the_encoder_proposer_is_incremental(encoder_warehouse):
    from sira.jobs import enrich as enrich_job
    from sira.pipelines.storage.delta_io import read_table
    from sira.pipelines.enrichment.backend_config import BackendConfig

    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(proposals=4, vocabulary_tau=0.5,
                                                                             min_similarity=0.0))
    first = enrich_job.run(enrich_job.EnrichConfig(warehouse=encoder_warehouse, backend=backend, commit_every=5))
    assert (first["documents"], first["enriched"], first["errors"]) == (12, 12, 0)
    assert first["model"] == "encoder:all-MiniLM-L6-v2" and first["prompt_version"].startswith("enc-")
    rows = read_table(f"{encoder_warehouse}/enrichment").to_pylist()
    assert len(rows) == 12 and {r["backend"] for r in rows} == {"encoder"}
    docs = {d["doc_id"]: d for d in read_table(f"{encoder_warehouse}/docs").to_pylist()}
    analyzer = Analyzer(get_preset("sira").analyzer)
    for r in rows:
        assert 0 < len(r["phrases"]) <= 4 and len(r["weights"]) == len(r["phrases"])
        assert all(0 < w <= 1 for w in r["weights"])
        held = set(analyzer.tokens(docs[r["doc_id"]]["title"] + " " + docs[r["doc_id"]]["text"]))
        assert not any(set(analyzer.tokens(p)) <= held for p in r["phrases"]), r
        assert json.loads(r["raw_output"])["phrases"] == r["phrases"]
    again = enrich_job.run(enrich_job.EnrichConfig(warehouse=encoder_warehouse, backend=backend))
    assert (again["enriched"], again["skipped"]) == (0, 12)


@pytest.mark.integration
def test_vocabulary_cache_is_per_index_version(encoder_warehouse, spark):
    from sira.jobs import index as index_job
    from sira.pipelines.enrichment import encoder_proposer
    from sira.pipelines.storage.delta_io import read_table
    from sira.pipelines.index.catalog import find_index

    cfg = EncoderProposerConfig(vocabulary_tau=0.5)
    v1 = find_index(encoder_warehouse, enriched=False)
    first = encoder_proposer.load_vocabulary(encoder_warehouse, v1, cfg)
    calls = []
    real = encoder_proposer.shared_encoder

    def counting(max_tokens=256, model="all-MiniLM-L6-v2"):
        enc = real(max_tokens, model)
        calls.append(1)
        return enc

    encoder_proposer.shared_encoder = counting
    try:
        again = encoder_proposer.load_vocabulary(encoder_warehouse, v1, cfg)
        assert not calls and again.terms == first.terms  # served from Delta, nothing encoded
        index_job.run(index_job.IndexConfig(warehouse=encoder_warehouse, preset="sira", shards=2, enrichment=False),
                      spark=spark)
        v2 = find_index(encoder_warehouse, enriched=False)
        assert v2["index_version"] > v1["index_version"]
        second = encoder_proposer.load_vocabulary(encoder_warehouse, v2, cfg)
        assert not calls  # a new version gets its own membership; every surface form's vector is reused
        assert second.terms == first.terms and np.allclose(second.vectors, first.vectors)
    finally:
        encoder_proposer.shared_encoder = real
    cached = read_table(f"{encoder_warehouse}/vocabulary")
    assert sorted(set(cached["index_version"].to_pylist())) == [v1["index_version"], v2["index_version"]]


@pytest.mark.integration
def test_eval_both_sides_with_the_encoder_applies_the_df_filter_after_proposing(encoder_warehouse, tiny_beir):
    from sira.jobs import eval as eval_job
    from sira.pipelines.storage.delta_io import read_table
    from sira.pipelines.enrichment.backend_config import BackendConfig

    # The vocabulary admits terms in up to 90% of the docs; the query-side filter (tau 0.15) then rejects the
    # common ones: the proposer proposes, the DF statistics decide.
    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(proposals=6, vocabulary_tau=0.9,
                                                                             min_similarity=0.0))
    summary = eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=encoder_warehouse, variant="sira",
                                               shards=2, tau=0.15, backend=backend, doc_backend=backend))
    assert summary["expansion"]["model"] == "encoder:all-MiniLM-L6-v2"
    programs = [json.loads(line) for line in open(summary["programs_file"], encoding="utf-8")]
    expansions = [e for p in programs for e in p["expansions"]]
    assert {e["proposer"] for e in expansions} == {"encoder:all-MiniLM-L6-v2"}
    assert {e["reason"] for e in expansions} >= {"kept", "too common"}
    assert all(0 < e["weight"] <= 1 for e in expansions) and any(e["weight"] < 1 for e in expansions)
    proposed = read_table(f"{encoder_warehouse}/expansions").to_pylist()
    assert sum(len(r["phrases"]) for r in proposed) == len(expansions)  # every proposal reached the filter
    for p in programs:  # no expansion repeats what the query holds
        assert not any(set(e["terms"]) <= set(p["original_terms"]) for e in p["expansions"])
