from sira_core.analysis import Analyzer, AnalyzerConfig, ngrams
from sira_core.presets import get_preset


def test_sira_preset_folds_lowercases_stems_and_drops_stopwords():
    a = Analyzer(get_preset("sira").analyzer)
    assert a.tokens("The Café's RUNNING dogs!") == ["cafe", "run", "dog"]


def test_sira_preset_adds_bigrams_of_adjacent_surviving_tokens():
    a = Analyzer(get_preset("sira").analyzer)
    assert a.terms("heart attack in the elderly") == ["heart", "attack", "elder", "heart attack", "attack elder"]


def test_query_term_frequency_is_kept():
    a = Analyzer(AnalyzerConfig(max_n=1))
    assert a.terms("blood blood pressure") == ["blood", "blood", "pressur"]


def test_alnum_tokenizer_splits_on_every_non_alphanumeric():
    a = Analyzer(AnalyzerConfig(stopwords="none", stemmer="none"))
    assert a.tokens("IL-6 e.g. 3.5 mg/kg don't snake_case") == ["il", "6", "e", "g", "3", "5", "mg", "kg", "don", "t", "snake", "case"]


def test_lucene_like_tokenizer_keeps_numbers_acronyms_and_strips_possessives():
    a = Analyzer(AnalyzerConfig(fold=False, tokenizer="uax29", possessive=True, stopwords="none", stemmer="none"))
    assert a.tokens("The patient's IL-6 was 3.5 mg/kg in the U.S. (1,000 cases); don't") == [
        "the", "patient", "il", "6", "was", "3.5", "mg", "kg", "in", "the", "u.s", "1,000", "cases", "don't"
    ]


def test_pyserini_flat_uses_lucene_stopwords_and_porter():
    a = Analyzer(get_preset("pyserini-flat").analyzer)
    # "which" is not a Lucene stopword; "the" and "of" are. Porter: "generalization" -> "gener".
    assert a.tokens("Which of the generalizations") == ["which", "gener"]


def test_phrases_are_analysed_one_by_one_so_ngrams_never_span_phrases():
    a = Analyzer(AnalyzerConfig(max_n=2, stemmer="none"))
    assert a.terms_of_phrases(["heart attack", "statin"]) == ["heart", "attack", "heart attack", "statin"]


def test_ngrams_up_to_order_three():
    assert ngrams(["a", "b", "c"], 3) == ["a", "b", "c", "a b", "b c", "a b c"]


def test_porter_leaves_one_and_two_letter_words_alone_like_lucene():
    a = Analyzer(AnalyzerConfig(stemmer="porter", stopwords="none"))
    assert a.tokens("s us news flies") == ["s", "us", "new", "fli"]
