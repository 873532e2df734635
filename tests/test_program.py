"""RetrievalProgram: compilation into one weighted BM25 call, constraints, JSON round trip."""

import pytest

from sira.core.analysis import AnalyzerConfig
from sira.core.dfstats import ExpansionDecision
from sira.core.memory_index import build_searcher
from sira.core.presets import BM25Params, IndexPreset
from sira.core.program import RetrievalProgram, constraint_terms

PRESET = IndexPreset(name="t", analyzer=AnalyzerConfig(stemmer="none", max_n=2), bm25=BM25Params())
DOCS = [("a", "", "heart attack aspirin"), ("b", "", "myocardial infarction statins"),
        ("c", "", "heart failure aspirin"), ("d", "", "stroke prevention statins aspirin")]


@pytest.fixture(scope="module")
def searcher():
    return build_searcher(DOCS, PRESET, num_shards=2)


def decision(phrase, kept, terms, reason="kept"):
    return ExpansionDecision(phrase, kept, reason, tuple(terms), tuple(1 for _ in terms))


def test_program_compiles_to_orig_plus_w_times_kept_expansions(searcher):
    program = RetrievalProgram.build(
        "heart attack", searcher.analyzer,
        [decision("myocardial infarction", True, ["myocardial", "infarction", "myocardial infarction"]),
         decision("cardiology", False, ["cardiology"], "unseen")], w=0.5)
    parts = program.parts()
    assert [(p.name, p.weight) for p in parts] == [("original", 1.0), ("expansion:myocardial infarction", 0.5)]
    orig = {h.doc_id: h.score for h in searcher.search("heart attack", k=10)}
    exp = {h.doc_id: h.score for h in searcher.search("myocardial infarction", k=10)}
    got = {h.doc_id: h.score for h in searcher.search(program, k=10)}
    assert set(got) == {"a", "b", "c"}
    for doc, score in got.items():
        assert score == pytest.approx(orig.get(doc, 0) + 0.5 * exp.get(doc, 0), rel=1e-5)


def test_w_zero_is_the_plain_query(searcher):
    program = RetrievalProgram.build("aspirin", searcher.analyzer, [decision("statins", True, ["statins"])], w=0.0)
    assert [h.doc_id for h in searcher.search(program, k=10)] == [h.doc_id for h in searcher.search("aspirin", k=10)]


def test_must_and_exclude_constraints_filter_hits(searcher):
    base = RetrievalProgram.build("aspirin statins", searcher.analyzer)
    assert {h.doc_id for h in searcher.search(base, k=10)} == {"a", "b", "c", "d"}
    must = RetrievalProgram.build("aspirin statins", searcher.analyzer, must=["stroke"])
    assert [h.doc_id for h in searcher.search(must, k=10)] == ["d"]
    exclude = RetrievalProgram.build("aspirin statins", searcher.analyzer, exclude=["heart"])
    assert {h.doc_id for h in searcher.search(exclude, k=10)} == {"b", "d"}
    phrase = RetrievalProgram.build("aspirin", searcher.analyzer, must=["heart attack"])
    assert phrase.must == ["heart attack"] and [h.doc_id for h in searcher.search(phrase, k=10)] == ["a"]


def test_program_is_plain_json_and_round_trips(searcher):
    program = RetrievalProgram.build("heart attack", searcher.analyzer,
                                     [decision("infarction", True, ["infarction"])], must=["aspirin"])
    again = RetrievalProgram.model_validate_json(program.model_dump_json())
    assert again == program
    assert [h.doc_id for h in searcher.search(again, k=5)] == [h.doc_id for h in searcher.search(program, k=5)]


def test_constraint_of_only_stopwords_is_a_clear_error(searcher):
    with pytest.raises(ValueError, match="has no index terms"):
        constraint_terms("the of", searcher.analyzer)


def test_the_expansion_weight_is_the_given_one_else_the_proposers_own():
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.core.program import DEFAULT_W
    from sira.core.proposers import ENCODER_DEFAULT_W

    assert BackendConfig(backend="encoder").resolve_w(None) == ENCODER_DEFAULT_W
    assert BackendConfig(backend="openai", model="m").resolve_w(None) == DEFAULT_W
    assert BackendConfig(backend="encoder").resolve_w(0.3) == 0.3 and BackendConfig(backend="local").resolve_w(0.0) == 0.0
