"""Pruned top-k (MaxScore over all shards, lists in tiers) returns exactly what exhaustive scoring returns: the
same doc ordinals, the same scores bit for bit, the same order among ties, with weighted parts, must and exclude
terms, skipped documents, floors from other shards, one shard or several."""

import numpy as np
import pyarrow as pa
import pytest

from sira.core import bm25
from sira.core.analysis import AnalyzerConfig
from sira.core.bm25 import CorpusStats, ShardIndex, WeightedQuery
from sira.core.memory_index import build_searcher
from sira.core.presets import BM25Params, IndexPreset
from sira.core.search import QueryPart, RankedBatch, merge_batches

PLAIN = IndexPreset(name="plain", analyzer=AnalyzerConfig(stopwords="none", stemmer="none", max_n=1),
                    bm25=BM25Params(k1=1.2, b=0.75))

# Production settings, and one that stresses every path: terms in tiers from 4 postings, merges whenever a list is
# longer than the candidates (galloping, not scanning), many lists added to touched docs after the switch, and
# a pool that is kept down to its k best whenever it holds 2k docs.
TUNED = [(bm25.shard, "TIER_MIN_POSTINGS"), (bm25.pruning, "MERGE_RATIO"), (bm25.pruning, "EXTEND_FRACTION"),
         (bm25.pruning, "POOL_CAPACITY")]  # each on the submodule that reads it at call time
SETTINGS = [tuple(getattr(module, name) for module, name in TUNED), (4, 1, 0.3, 1)]


def use_settings(monkeypatch, settings):
    for (module, name), value in zip(TUNED, settings):
        monkeypatch.setattr(module, name, value)


def synthetic_shard(n_docs: int, vocab: int, kind: str, seed: int) -> ShardIndex:
    """Postings drawn straight as arrays, impacts from the BM25 formula. kind: "zipf" (Zipf term choice: a few
    very long lists, many ties from equal tf and length), "uniform" (short lists, few ties) or "flat" (Zipf,
    b = 0 and tf 1: a term has one impact everywhere, so block bounds are exactly tight and ties are the rule)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 40, n_docs)
    p = np.ones(vocab) if kind == "uniform" else 1 / np.arange(1, vocab + 1)
    terms = rng.choice(vocab, size=lens.sum(), p=p / p.sum())
    docs = np.repeat(np.arange(n_docs), lens)
    pair, tf = np.unique(terms.astype(np.int64) * n_docs + docs, return_counts=True)
    term, ords = pair // n_docs, pair % n_docs
    uniq, starts, dfs = np.unique(term, return_index=True, return_counts=True)
    flat = kind == "flat"
    return ShardIndex.from_postings(
        0, [f"d{i:06d}" for i in range(n_docs)], lens, uniq * 7919 + 11, dfs, np.append(starts, len(term)),
        ords, np.ones_like(tf) if flat else tf, CorpusStats(n_docs, float(lens.mean()), 1.2, 0.0 if flat else 0.75))


def random_query(rng, vocab: int, zipf: bool = True) -> WeightedQuery:
    """An original part (weight 1 per occurrence) and often an expansion of many terms at w 0.5 or random
    weights; term choice skewed to common terms on Zipf corpora, so long lists are exercised."""
    n_orig = int(rng.integers(1, 6))
    n_exp = int(rng.choice([0, 5, 40]))
    pick = (lambda n: np.minimum(rng.zipf(1.3, n) - 1, vocab - 1)) if zipf else (lambda n: rng.integers(0, vocab, n))
    terms = np.concatenate([pick(n_orig), pick(n_exp), [vocab + 5]])  # plus one term no document holds
    weights = np.concatenate([np.ones(n_orig), rng.choice([0.5, 0.25, 1.7, 3.0], n_exp), [1.0]])
    uniq, inv = np.unique(terms, return_inverse=True)
    summed = np.bincount(inv, weights=weights).astype(np.float32)
    return WeightedQuery(tuple(f"t{t}" for t in uniq), uniq * 7919 + 11, summed)


def reference_top_k(shard: ShardIndex, query: WeightedQuery, k: int, must=(), exclude=(), skip=()):
    """Dense numpy scoring with the module's fixed-point definition, and a lexsort: nothing shared with the
    kernels but the arrays."""
    acc = np.zeros(shard.num_docs, dtype=np.int64)
    for row, w in zip(shard.rows_of(query.term_ids), query.weights):
        if row >= 0:
            lo, hi = shard.indptr[row], shard.indptr[row + 1]
            scale = np.float64(w) * 2.0**bm25.FIXED_POINT_BITS
            np.add.at(acc, shard.doc_ords[lo:hi], np.ceil(shard.impacts[lo:hi].astype(np.float64) * scale).astype(np.int64))
    allowed = acc > 0
    for tid in must:
        holds = np.zeros(shard.num_docs, dtype=bool)
        holds[shard.docs_with_term(tid)] = True
        allowed &= holds
    for tid in exclude:
        allowed[shard.docs_with_term(tid)] = False
    allowed[np.asarray(skip, dtype=np.int64)] = False
    cand = np.flatnonzero(allowed)
    top = cand[np.lexsort((cand, -acc[cand]))][:k]
    return top.astype(np.int32), acc[top] * 2.0**-bm25.FIXED_POINT_BITS


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("kind", ["zipf", "uniform", "flat"])
def test_pruned_equals_exhaustive_and_reference(monkeypatch, settings, kind):
    use_settings(monkeypatch, settings)
    vocab = 300
    shard = synthetic_shard(6000, vocab, kind, seed=settings[0])
    rng = np.random.default_rng(settings[1])
    queries = [random_query(rng, vocab, kind != "uniform") for _ in range(40)]
    for k in (1, 10, 100, 1000):
        pruned = shard.top_k_many(queries, k, scorer="pruned")
        exhaustive = shard.top_k_many(queries, k, scorer="exhaustive")
        for i, q in enumerate(queries):
            ref_ords, ref_scores = reference_top_k(shard, q, k)
            for ords, scores, counts in (pruned, exhaustive):
                assert ords[i, : counts[i]].tolist() == ref_ords.tolist(), (k, i)
                assert scores[i, : counts[i]].tolist() == ref_scores.tolist(), (k, i)


@pytest.mark.parametrize("settings", SETTINGS)
def test_must_exclude_and_skipped_docs_are_exact_filters(monkeypatch, settings):
    use_settings(monkeypatch, settings)
    vocab = 200
    shard = synthetic_shard(5000, vocab, "zipf", seed=3)
    rng = np.random.default_rng(4)
    queries, constraints, skips = [], [], []
    for _ in range(60):
        q = random_query(rng, vocab)
        # Must terms from the query or not, common or rare; exclude terms likewise; one term the shard lacks.
        must = [int(t) * 7919 + 11 for t in rng.choice(40, int(rng.integers(0, 3)), replace=False)]
        exclude = [int(t) * 7919 + 11 for t in rng.choice(vocab, int(rng.integers(0, 3)), replace=False)]
        if rng.random() < 0.1:
            must.append((vocab + 9) * 7919 + 11)
        queries.append(q)
        constraints.append((must, exclude))
        skips.append(np.sort(rng.choice(shard.num_docs, int(rng.integers(0, 50)), replace=False)).astype(np.int32))
    for k in (1, 10, 1000):
        pruned = shard.top_k_many(queries, k, constraints, skips, scorer="pruned")
        exhaustive = shard.top_k_many(queries, k, constraints, skips, scorer="exhaustive")
        for i, (q, (must, exclude), skip) in enumerate(zip(queries, constraints, skips)):
            ref_ords, ref_scores = reference_top_k(shard, q, k, must, exclude, skip)
            for ords, scores, counts in (pruned, exhaustive):
                assert ords[i, : counts[i]].tolist() == ref_ords.tolist(), (k, i)
                assert scores[i, : counts[i]].tolist() == ref_scores.tolist(), (k, i)


def zipf_text_corpus(n_docs: int, vocab: int, seed: int, duplicates: int = 0):
    """Text documents over Zipf words; `duplicates` exact copies of a few texts under other ids (ties across
    shards)."""
    rng = np.random.default_rng(seed)
    p = 1 / np.arange(1, vocab + 1)
    docs = [(f"doc{i:05d}", "", " ".join(f"w{t}" for t in rng.choice(vocab, int(rng.integers(1, 30)), p=p / p.sum())))
            for i in range(n_docs)]
    docs += [(f"dup{i:05d}", "", docs[i % 7][2]) for i in range(duplicates)]
    return docs


@pytest.mark.parametrize("num_shards", [1, 3, 8])
def test_sharded_pruned_search_equals_one_exhaustive_shard(monkeypatch, num_shards):
    use_settings(monkeypatch, SETTINGS[1])
    docs = zipf_text_corpus(3000, 150, seed=num_shards, duplicates=40)
    one = build_searcher(docs, PLAIN, num_shards=1)
    many = build_searcher(docs, PLAIN, num_shards=num_shards)
    rng = np.random.default_rng(num_shards)
    queries, constraints, excluded = [], [], []
    for _ in range(40):
        words = [f"w{t}" for t in np.minimum(rng.zipf(1.4, int(rng.integers(1, 5))) - 1, 149)]
        expansion = [f"w{t}" for t in rng.integers(0, 150, int(rng.choice([0, 30])))]
        queries.append([QueryPart(tuple(words)), QueryPart(tuple(expansion), 0.5, "expansion")] if expansion
                       else [QueryPart(tuple(words))])
        constraints.append(([f"w{rng.integers(0, 5)}"] if rng.random() < 0.3 else [],
                            [f"w{rng.integers(0, 20)}"] if rng.random() < 0.3 else []))
        excluded.append([f"doc{i:05d}" for i in rng.integers(0, 3000, 3)] + ["dup00001"])
    for k in (1, 10, 100, 3100):
        expected = one.rank_many(queries, k, excluded, constraints, scorer="exhaustive")
        for scorer in ("pruned", "auto", "exhaustive"):  # the last two with other shards' floors
            for e, g in zip(expected, many.rank_many(queries, k, excluded, constraints, scorer)):
                assert g.doc_ids.to_pylist() == e.doc_ids.to_pylist()
                assert g.scores.tolist() == e.scores.tolist()


def test_scores_too_large_for_exact_sums_are_refused():
    shard = synthetic_shard(100, 20, "uniform", seed=1)
    query = WeightedQuery(("t0",), np.array([11], dtype=np.int64), np.array([1e9], dtype=np.float32))
    with pytest.raises(ValueError, match="query weights too large"):
        shard.top_k(query, 10)


def unit_shard():
    """Impacts of a few units of 2^-32, so contributions are exact small integers and bounds equal scores.
    Term 1: doc 0 (10 units), doc 40 (3). Term 2: doc 20 (7), doc 40 (7). Scores: doc 0 and doc 40 10, doc 20 7."""
    unit = 2.0**-bm25.FIXED_POINT_BITS
    shard = ShardIndex(0, [f"d{i:03d}" for i in range(64)], np.ones(64), np.array([1, 2]), np.array([0, 2, 4]),
                       np.array([0, 40, 20, 40]), np.array([10, 3, 7, 7], dtype=np.float32) * np.float32(unit))
    return shard, WeightedQuery(("a", "b"), np.array([1, 2]), np.ones(2, dtype=np.float32)), unit


def test_a_candidate_that_can_just_reach_the_floor_is_kept():
    # After term 1, doc 0 scores 10 exactly: the floor is 10. Doc 40 holds 3 and term 2 can add at most 7:
    # 3 + 7 == 10 may still tie doc 0 (and a tie is ranked by ordinal), so it must stay a candidate.
    shard, query, unit = unit_shard()
    for scorer in ("pruned", "exhaustive"):
        ords, scores = shard.top_k(query, 2, scorer=scorer)
        assert ords.tolist() == [0, 40] and scores.tolist() == [10 * unit, 10 * unit]


def test_a_doc_scoring_exactly_the_floor_of_other_shards_is_returned():
    # Another shard holds k hits scoring 7 units: a doc of this shard scoring 7 may still win on its doc id.
    # Doc 20 is in term 2 only, whose bound (7) equals the floor, so term 2 must be scored in full.
    shard, query, unit = unit_shard()
    for scorer in ("pruned", "exhaustive"):
        ords, scores, counts = shard.top_k_many([query], 3, scorer=scorer, floors=np.array([7 * unit]))
        assert ords[0, : counts[0]].tolist() == [0, 40, 20]
        assert scores[0, : counts[0]].tolist() == [10 * unit, 10 * unit, 7 * unit]
        ords, scores, counts = shard.top_k_many([query], 3, scorer=scorer, floors=np.array([8 * unit]))
        assert ords[0, : counts[0]].tolist() == [0, 40]  # below another shard's k-th best: not needed


def test_merging_shard_batches_breaks_cross_shard_ties_by_doc_id():
    # The Ray actors' path: each shard's batch of hits, every query's sorted by (score desc, doc id asc).
    def batch(ids, scores, counts):
        return RankedBatch(pa.array(ids, pa.large_string()), np.array(scores), np.concatenate([[0], np.cumsum(counts)]))

    merged = merge_batches([batch(["b", "d", "f", "x"], [3.0, 2.0, 2.0, 1.0], [3, 1]),
                            batch(["a", "c", "e"], [2.0, 2.0, 1.0], [3, 0])], 4)
    assert [(ids.to_pylist(), scores.tolist()) for ids, scores in merged] == [
        (["b", "a", "c", "d"], [3.0, 2.0, 2.0, 2.0]), (["x"], [1.0])]


def test_doc_ids_out_of_order_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        ShardIndex(0, ["b", "a"], np.ones(2), np.array([1]), np.array([0, 2]), np.array([0, 1]),
                   np.ones(2, dtype=np.float32))


def test_a_large_k_whose_sampled_threshold_lets_too_few_hits_through_gathers_again():
    # Every 16th doc (the ones the exhaustive scorer samples to guess its threshold at a large k) holds a term of
    # high, varied impacts; the others only a common term of low impact. The guess lets about 2k / 16 of the
    # sampled docs through, fewer than k, so the scorer must gather again from the true threshold.
    n_docs, k = 4096, bm25.HISTOGRAM_K
    rng = np.random.default_rng(5)
    rare = np.arange(0, n_docs, bm25.SAMPLE_STRIDE)
    ords = np.concatenate([np.arange(n_docs), rare]).astype(np.int32)
    impacts = np.concatenate([rng.uniform(0.1, 0.2, n_docs), rng.uniform(5, 9, len(rare))]).astype(np.float32)
    shard = ShardIndex(0, [f"d{i:05d}" for i in range(n_docs)], np.ones(n_docs), np.array([1, 2]),
                       np.array([0, n_docs, len(ords)]), ords, impacts)
    query = WeightedQuery(("common", "rare"), np.array([1, 2]), np.ones(2, dtype=np.float32))
    ref_ords, ref_scores = reference_top_k(shard, query, k)
    for scorer in ("exhaustive", "pruned"):
        ords_, scores = shard.top_k(query, k, scorer=scorer)
        assert ords_.tolist() == ref_ords.tolist() and scores.tolist() == ref_scores.tolist()


def test_terms_in_tiers_keep_explain_and_constraints_exact(monkeypatch):
    # Terms of >= 4 postings in two tiers: --explain's contributions still find every posting and add up to the
    # score, and docs_with_term (must / exclude) still gives a term's docs sorted.
    use_settings(monkeypatch, SETTINGS[1])
    shard = synthetic_shard(2000, 100, "zipf", seed=9)
    assert len(shard.tier_rows) > 0
    monkeypatch.setattr(bm25.shard, "TIER_MIN_POSTINGS", 10**9)
    untiered = synthetic_shard(2000, 100, "zipf", seed=9)
    assert len(untiered.tier_rows) == 0
    for tid in shard.term_ids[:30]:
        docs = shard.docs_with_term(int(tid))
        assert np.all(np.diff(docs) > 0) and docs.tolist() == untiered.docs_with_term(int(tid)).tolist()
    rng = np.random.default_rng(2)
    for _ in range(20):
        query = random_query(rng, 100)
        ords, scores = shard.top_k(query, 10, scorer="pruned")
        for o, score in zip(ords, scores):
            parts = shard.contributions(int(o), query)
            assert parts == untiered.contributions(int(o), query)
            assert abs(sum(parts.values()) - score) <= len(parts) * 2.0**-bm25.FIXED_POINT_BITS
