"""Corpus-side SIRA logic with worked examples: prompts, the output parser, the DF filter."""

import numpy as np
import pytest

from sira.core.analysis import Analyzer, AnalyzerConfig
from sira.core.dfstats import contains_sequence, corpus_side_filter
from sira.core.enrichment import TASKS, document_input, load_template, parse_phrases, task_for_dataset


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_a_versioned_template_with_the_document_last(task):
    t = load_template("doc", task)
    prompt = t.render("THE DOCUMENT TEXT", max_n=3)
    assert prompt.rstrip().endswith("THE DOCUMENT TEXT")  # instructions first: prefix caching
    assert '{"keywords"' in prompt and "1 to 3 words" in prompt and "At most 10 phrases" in prompt
    assert t.version.startswith(f"doc-{task}-") and len(t.version) == len(f"doc-{task}-") + 10


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'poetry'"):
        load_template("doc", "poetry")


def test_dataset_tasks_and_document_input():
    assert task_for_dataset("scifact") == "fact_check" and task_for_dataset("arguana") == "argument"
    assert task_for_dataset("something-else") == "generic"
    assert document_input("Title", "x" * 5000) == ("Title. " + "x" * 5000)[:4000]
    assert document_input("", "text") == "text"


@pytest.mark.parametrize("raw, phrases", [
    ('{"keywords": ["MI", "heart attack", "statin therapy"]}', ["MI", "heart attack", "statin therapy"]),
    ('```json\n{"keywords": ["a b", "c"]}\n```', ["a b", "c"]),
    ('Sure! Here you go: ["x", "y"] hope it helps', ["x", "y"]),
    ('{"keywords": ["  spaced   out ", "Dup", "dup", "", 3, "one two three four five"]}', ["spaced out", "Dup"]),
    ('{"phrases": ["alt key"]}', ["alt key"]),
])
def test_parser_accepts_what_models_actually_write(raw, phrases):
    assert parse_phrases(raw, max_words=4) == (phrases, None)


@pytest.mark.parametrize("raw, error", [
    (None, "empty output"), ("   ", "empty output"), ("I cannot help with that.", "no JSON found"),
    ('{"answer": 42}', "JSON has no list"), ('{"keywords": [1, 2]}', "no usable phrase"), ('{"keywords": [', "no JSON"),
])
def test_parser_never_raises_on_junk(raw, error):
    phrases, err = parse_phrases(raw)
    assert phrases == [] and err.startswith(error)


def test_parser_caps_the_number_of_phrases():
    raw = '{"keywords": [' + ", ".join(f'"p{i}"' for i in range(30)) + "]}"
    assert len(parse_phrases(raw, max_phrases=10)[0]) == 10


def test_contains_sequence():
    assert contains_sequence(["a", "b", "c"], ["b", "c"]) and not contains_sequence(["a", "b", "c"], ["a", "c"])
    assert not contains_sequence(["a"], [])


def test_corpus_side_filter_worked_example():
    # |C| = 20, tau = 0.1 -> a phrase is too common when its rarest sub-n-gram has DF > 2.
    analyzer = Analyzer(AnalyzerConfig(stemmer="none", stopwords="nltk127", max_n=2))
    df = {"heart": 5, "attack": 3, "heart attack": 1, "blood": 10, "pressure": 4, "blood pressure": 3,
          "cardiac": 2}
    doc_tokens = analyzer.tokens("Cardiac arrest in the elderly")
    decisions = corpus_side_filter(
        ["heart attack", "blood pressure", "myocardial infarction", "cardiac", "the of", "Elderly",
         "heart-attack-heart-attack"],
        doc_tokens, analyzer, lambda terms: {t: df[t] for t in terms if t in df}, num_docs=20, tau=0.1)
    got = {d.phrase: (d.kept, d.reason, d.min_df) for d in decisions}
    assert got == {
        "heart attack": (True, "kept", 1),            # its bigram is rare
        "blood pressure": (False, "too common", 3),   # rarest sub-n-gram has DF 3 > 2
        "myocardial infarction": (True, "kept", 0),   # unseen in the corpus: kept
        "cardiac": (False, "in document", None),
        "the of": (False, "no terms", None),          # only stopwords
        "Elderly": (False, "in document", None),      # case-folded like the index
        # A degenerate item: its bigram "attack heart" is unseen, yet it would inject "heart" and "attack" twice.
        "heart-attack-heart-attack": (False, "repeats a word", None),
    }
    # Kept phrases inject every n-gram inside the phrase, never across phrases.
    assert decisions[0].terms == ("heart", "attack", "heart attack")
    assert decisions[2].terms == ("myocardial", "infarction", "myocardial infarction")


def test_query_side_filter_worked_example():
    # |C| = 20, tau = 0.1: keep a phrase when any sub-n-gram has 0 < DF <= 2 in the enriched index.
    from sira.core.dfstats import DFTable, query_side_filter
    from sira.core.hashing import term_id

    analyzer = Analyzer(AnalyzerConfig(stemmer="none", stopwords="nltk127", max_n=2))
    df = {"heart": 5, "attack": 3, "heart attack": 1, "blood": 10, "pressure": 4, "blood pressure": 3}
    table = DFTable(np.array([term_id(t) for t in df]), np.array(list(df.values())), num_docs=20)
    assert table.lookup(["heart attack", "nope"]) == {"heart attack": 1}
    decisions = query_side_filter(["heart attack", "blood pressure", "zebrafish", "the of"], analyzer, table.lookup,
                                  num_docs=20, tau=0.1)
    assert [(d.phrase, d.kept, d.reason) for d in decisions] == [
        ("heart attack", True, "kept"), ("blood pressure", False, "too common"),
        ("zebrafish", False, "unseen"), ("the of", False, "no terms")]
    assert decisions[0].dfs == (5, 3, 1)


def test_a_phrase_with_the_terms_of_an_earlier_one_is_a_duplicate():
    from sira.core.dfstats import DFTable, query_side_filter
    from sira.core.hashing import term_id

    analyzer = Analyzer(AnalyzerConfig(max_n=2))  # Snowball: "attacks" stems like "attack"
    df = {"heart": 1, "attack": 1, "heart attack": 1}
    table = DFTable(np.array([term_id(t) for t in df]), np.array(list(df.values())), num_docs=20)
    decisions = query_side_filter(["heart attack", "Heart attacks!", "zebrafish", "zebrafish"], analyzer,
                                  table.lookup, num_docs=20, tau=0.1)
    assert [(d.kept, d.reason) for d in decisions] == [(True, "kept"), (False, "duplicate"), (False, "unseen"),
                                                       (False, "duplicate")]
