"""The one query path (sira.core.query_path): queries -> proposals -> DF-validated programs -> ranked results, over
real in-memory shards, with recorded proposals standing in for the proposer."""

from collections import Counter

import numpy as np
import pytest

from sira.core.analysis import AnalyzerConfig
from sira.core.dfstats import DFTable
from sira.core.hashing import term_id
from sira.core.memory_index import build_searcher
from sira.core.presets import BM25Params, IndexPreset
from sira.core.proposers import Proposal
from sira.core.query_path import QueryPath

PRESET = IndexPreset(name="t", analyzer=AnalyzerConfig(stemmer="none", max_n=2), bm25=BM25Params())
DOCS = [("a", "", "heart attack aspirin"), ("b", "", "myocardial infarction statins"),
        ("c", "", "heart failure aspirin"), ("d", "", "stroke prevention statins aspirin"),
        ("e", "", "aspirin dose"), ("f", "", "aspirin allergy"), ("g", "", "statins cholesterol")]
QUERIES = ["heart attack", "stroke"]
# What a proposer said for each query: kept (rare in the index), unseen, too common (aspirin: 5 of 7 docs).
PROPOSALS = [Proposal(["myocardial infarction", "cardiology", "aspirin"], [0.8, 1.0, 1.0]),
             Proposal(["statins"], [1.0])]


def path_over(num_shards: int) -> QueryPath:
    searcher = build_searcher(DOCS, PRESET, num_shards=num_shards)
    df = Counter(t for _, title, text in DOCS for t in set(searcher.analyzer.terms(f"{title} {text}")))
    table = DFTable(np.array([term_id(t) for t in df]), np.array(list(df.values())), num_docs=len(DOCS))
    return QueryPath(searcher, searcher.analyzer, len(DOCS), index_version=3, df_table=table, tau=0.5)


@pytest.fixture(scope="module")
def path():
    return path_over(2)


def test_proposals_become_df_validated_programs(path):
    programs = path.programs(QUERIES, PROPOSALS, w=0.5, proposer="recorded", prompt_version="p1")
    assert [(e.phrase, e.reason) for e in programs[0].expansions] == [
        ("myocardial infarction", "kept"), ("cardiology", "unseen"), ("aspirin", "too common")]
    assert programs[0].expansions[0].weight == 0.8 and programs[1].expansions[0].kept
    assert {(p.index_version, p.prompt_version, p.expansions[0].proposer) for p in programs} == {(3, "p1", "recorded")}
    assert [p.expansions for p in path.programs(QUERIES)] == [[], []]


def test_ranked_results_are_the_searchers_for_each_program(path):
    programs = path.programs(QUERIES, PROPOSALS, w=0.5, must=["heart"])
    ranked = path.rank(programs, 5)
    assert all(p.must == ["heart"] for p in programs)
    for program, (doc_ids, scores) in zip(programs, ranked):
        expected = path.scorer.search(program, k=5)
        assert doc_ids.to_pylist() == [h.doc_id for h in expected]
        assert scores.round(4).tolist() == [round(h.score, 4) for h in expected]
    assert ranked[0][0].to_pylist() == ["a", "c"]  # "b" holds the expansion but not the must term
    assert ranked[1][0].to_pylist() == []


def test_shards_do_not_change_the_ranking_and_excluded_docs_are_filled_around():
    one, three = path_over(1), path_over(3)
    programs = one.programs(QUERIES, PROPOSALS, w=0.5)
    for exclude in (None, [("a",), ("d",)]):
        got = [(ids.to_pylist(), s.round(4).tolist()) for ids, s in three.rank(programs, 3, exclude)]
        assert got == [(ids.to_pylist(), s.round(4).tolist()) for ids, s in one.rank(programs, 3, exclude)]
    [(ids, _)] = one.rank(programs[:1], 2, [("a",)])
    assert sorted(ids.to_pylist()) == ["b", "c"]  # the other two docs that match


def test_contributions_add_up_to_each_hits_score(path):
    [program] = path.programs(QUERIES[:1], PROPOSALS[:1], w=0.5)
    [(doc_ids, scores)] = path.rank([program], 5)
    contributions = path.contributions(program, doc_ids.to_pylist() + ["nowhere"])
    for doc_id, score in zip(doc_ids.to_pylist(), scores.tolist()):
        assert sum(contributions[doc_id].values()) == pytest.approx(score, abs=1e-6)
    assert contributions["nowhere"] == {}


def test_proposals_need_the_df_table_and_one_per_query(path):
    with pytest.raises(ValueError, match="DF table"):
        QueryPath(path.scorer, path.analyzer, len(DOCS)).programs(QUERIES, PROPOSALS)
    with pytest.raises(ValueError, match="2 queries but 1 proposals"):
        path.programs(QUERIES, PROPOSALS[:1])


class RecordedProposer:
    """A TermProposer that answers from PROPOSALS and counts its calls."""

    name, version, default_w = "recorded", "p1", 0.25

    def __init__(self):
        self.calls = []

    def propose(self, texts):
        self.calls.append(list(texts))
        return [PROPOSALS[QUERIES.index(t)] for t in texts]


def test_a_retriever_is_a_table_in_table_out_call_with_one_home_for_w_and_self_hits(path):
    import pyarrow as pa

    from sira.core.retriever import RESULTS_SCHEMA, Retriever, hits_by_query

    proposer = RecordedProposer()
    retriever = Retriever(path, proposer, k=5, batch_size=1)
    queries = pa.table({"qid": ["q1", "q2"], "query": QUERIES})
    programs, results = retriever.run(queries)
    assert results.schema == RESULTS_SCHEMA and proposer.calls == [QUERIES]  # asked once for the whole set
    assert [p.w for p in programs] == [0.25, 0.25] and programs[0].expansions[0].proposer == "recorded"
    expected_programs = path.programs(QUERIES, PROPOSALS, w=0.25, proposer="recorded", prompt_version="p1")
    ranked = path.rank(expected_programs, 5)
    assert programs == expected_programs
    assert hits_by_query(results) == {q: dict(zip(ids.to_pylist(), scores.tolist()))
                                      for q, (ids, scores) in zip(["q1", "q2"], ranked) if len(ids)}
    q1 = results.filter(pa.compute.equal(results["qid"], "q1"))
    assert q1["rank"].to_pylist() == list(range(1, q1.num_rows + 1))
    assert q1["program"].combine_chunks().dictionary.to_pylist()[0] == programs[0].model_dump_json()
    assert retriever(queries).equals(results)
    # An explicit w wins over the proposer's; a plain retriever records the program's default.
    assert Retriever(path, proposer, w=0.7).programs(QUERIES)[0].w == 0.7
    assert Retriever(path).programs(QUERIES)[0].w == 0.5 and Retriever(path, w=0.7).programs(QUERIES)[0].w == 0.5
    # A query whose id is a document's never gets that document back.
    plain = Retriever(path, k=3)
    assert "a" in hits_by_query(plain({"a": "heart attack aspirin"}))["a"]
    assert "a" not in hits_by_query(Retriever(path, k=3, exclude_self=True)({"a": "heart attack aspirin"}))["a"]


def test_a_retriever_refuses_queries_without_an_id_or_a_text(path):
    import pyarrow as pa

    from sira.core.retriever import Retriever

    with pytest.raises(ValueError, match="needs columns qid and query"):
        Retriever(path)(pa.table({"id": ["1"], "text": ["x"]}))
    with pytest.raises(ValueError, match="query 'q2': a query needs an id and a text"):
        Retriever(path)({"q1": "heart", "q2": "  "})


def test_a_batch_ranks_each_query_as_it_would_alone_and_per_shard_batches_merge_to_it():
    """Scorers answer a batch as one RankedBatch (flat doc ids and scores, per-query offsets): equal to ranking each
    query alone, and the merge of each shard's own batch (what shard actors send) equals the whole searcher's."""
    from sira.core.search import RankedBatch, Searcher, merge_batches

    whole = path_over(3).scorer
    queries = [whole.compile(q) for q in ("aspirin", "statins heart", "aspirin statins stroke", "nothing here")]
    for k in (1, 2, 10):
        batch = whole.retrieve(queries, k)
        assert isinstance(batch, RankedBatch) and len(batch) == len(queries)
        alone = [whole.rank_many([q], k)[0] for q in queries]
        assert [(ids.to_pylist(), s.tolist()) for ids, s in batch] == \
            [(r.doc_ids.to_pylist(), r.scores.tolist()) for r in alone]
        per_shard = [Searcher([shard], whole.stats, whole.analyzer).retrieve(queries, k) for shard in whole.shards]
        merged = merge_batches(per_shard, k)
        assert merged.doc_ids.to_pylist() == batch.doc_ids.to_pylist() and merged.scores.tolist() == \
            batch.scores.tolist() and merged.offsets.tolist() == batch.offsets.tolist()
