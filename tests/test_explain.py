"""sira.core.explain: a hit's contributions told apart by query part and by where the document holds the term."""

import pytest

from sira.core.analysis import Analyzer, AnalyzerConfig
from sira.core.dfstats import ExpansionDecision
from sira.core.explain import explain_hit, part_weights, snippet
from sira.core.program import RetrievalProgram
from sira.core.search import compile_query

ANALYZER = Analyzer(AnalyzerConfig(max_n=2))


def program(w=0.5) -> RetrievalProgram:
    decisions = [ExpansionDecision("cardiac arrest", True, "kept", ("cardiac", "arrest", "cardiac arrest"), (1, 1, 1)),
                 ExpansionDecision("heart", True, "kept", ("heart",), (1,)),
                 ExpansionDecision("blood", False, "too common", ("blood",), (9,))]
    return RetrievalProgram.build("heart attack", ANALYZER, decisions, w=w, weights={"heart": 0.5})


def test_part_weights_add_up_to_the_compiled_query():
    weights = part_weights(program())
    compiled = compile_query(program().parts())
    assert {t: o + e for t, (o, e) in weights.items()} == pytest.approx(dict(zip(compiled.terms, compiled.weights)))
    assert weights["heart"] == (1.0, 0.25) and weights["cardiac arrest"] == (0.0, 0.5) and "blood" not in weights


def test_contributions_split_by_part_and_enrichment_only_terms():
    rows = explain_hit(program(), {"heart": 2.5, "cardiac": 1.0, "attack": 1.5}, ANALYZER.terms("heart attack"),
                       ["cardiac arrest", "arrhythmia"], ANALYZER)
    assert [r["term"] for r in rows] == ["heart", "attack", "cardiac"]
    heart, attack, cardiac = rows
    assert (heart["original"], heart["expansion"]) == pytest.approx((2.0, 0.5))
    assert heart["expansions"] == ["heart"] and not heart["enrichment_only"] and heart["injected"] == []
    assert (attack["original"], attack["expansion"]) == (1.5, 0.0)
    assert (cardiac["original"], cardiac["expansion"]) == (0.0, 1.0)
    assert cardiac["enrichment_only"] and cardiac["injected"] == ["cardiac arrest"]


def test_snippet_is_the_window_with_most_matches_in_order():
    text = "Filler words here. " * 20 + "Aspirin reduces the risk of heart attacks in patients. " + "More filler. " * 20
    segments = snippet(text, ["heart", "attack", "heart attack", "aspirin"], ANALYZER, words=8)
    assert segments[0] == {"text": "\u2026 here. ", "match": False} and segments[-1]["text"].endswith("\u2026")
    assert [s["text"] for s in segments if s["match"]] == ["Aspirin", "heart", "attacks"]
    assert "".join(s["text"] for s in segments).strip("\u2026 ") in text
    # Two words of context before the first match, the rest after it.
    text = " ".join(f"w{i}" for i in range(30)) + " heart " + " ".join(f"v{i}" for i in range(30))
    shown = "".join(s["text"] for s in snippet(text, ["heart"], ANALYZER, words=8))
    assert shown == "\u2026 w28 w29 heart v0 v1 v2 v3 v4 \u2026"
    whole = snippet("Heart attack.", ["heart"], ANALYZER)
    assert whole == [{"text": "Heart", "match": True}, {"text": " attack.", "match": False}]
    assert snippet("", ["heart"], ANALYZER) == [] and snippet("!!", ["x"], ANALYZER) == [{"text": "!!", "match": False}]
