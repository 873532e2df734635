from sira.core.analysis import Analyzer, AnalyzerConfig, ngrams
from sira.core.presets import get_preset


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


# ---- BatchAnalyzer: the index build's vectorised analysis must give Analyzer.terms exactly ----------------------

import random  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402

from sira.core.analysis import BatchAnalyzer, TermSet  # noqa: E402
from sira.core.hashing import term_id  # noqa: E402

TRICKY = ["", "the a an of", "Café naïve Über-größe ﬁnance", "x\u0301\u0302y \U0001D165z", "don't U.S. 3.5 1,000 "
          "John's dog\u2019s e.g. IL-6", "a b a b a b", "Résumé résumé RESUME", "日本語 テキスト", "snake_case x_y",
          # The batch path splits on ASCII whitespace first: none of these may change a term.
          "tab\there new\nline\r\nx\x0bvt\x0cff  double", "no\u00a0break\u2003em", "ΟΔΟΣ ΟΔΟΣ\tΣ", " \u0301x é",
          "½ ㎏ ™ ﬁ", "u.s.\ta.b. 1,000\n2.5 it's\tdogs'"]


def random_texts(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    words = ["heart", "attack", "the", "of", "running", "runs", "café", "naïve", "IL-6", "3.5", "U.S.", "don't",
             "patient's", "blood", "pressure", "ﬁnance", "x\u0301", "1,000", "e.g.", "über", "日本", "a", "insulin"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(n)] + TRICKY


@pytest.mark.parametrize("preset", ["sira", "pyserini-flat", "sira@n=3"])
def test_batch_analysis_equals_analyzer_terms_counts_and_lengths(preset):
    config = get_preset(preset).analyzer
    texts = random_texts(300)
    batch = BatchAnalyzer(config, cache_limit=50)  # small: the caches are emptied between the batches too
    reference = Analyzer(config)
    for part in (texts[:150], texts[150:]):
        got = batch.analyze(part)
        for i, text in enumerate(part):
            counts = Counter(reference.terms(text))
            lo, hi = got.offsets[i], got.offsets[i + 1]
            assert list(zip(got.term_ids[lo:hi].tolist(), got.tfs[lo:hi].tolist())) == \
                sorted((term_id(t), n) for t, n in counts.items()), text
            assert got.doc_lens[i] == sum(counts.values())


def test_batch_analysis_of_an_arrow_array_equals_that_of_a_list():
    config = get_preset("pyserini-flat").analyzer
    texts = random_texts(50)
    got, expected = BatchAnalyzer(config).analyze(pa.array(texts)), BatchAnalyzer(config).analyze(texts)
    assert all(np.array_equal(getattr(got, f), getattr(expected, f)) for f in ("offsets", "term_ids", "tfs", "doc_lens"))
    with pytest.raises(ValueError, match="text 1 of the batch is null"):
        BatchAnalyzer(config).analyze(pa.array(["a", None]))


def test_new_terms_are_spelled_as_the_analyzer_spells_them_and_given_once():
    config = get_preset("sira").analyzer
    texts = random_texts(100)
    got = BatchAnalyzer(config).analyze(texts)
    seen = TermSet()
    ids, spelled = got.new_terms(seen)
    expected = {term_id(t): t for text in texts for t in Analyzer(config).terms(text)}
    assert dict(zip(ids.tolist(), spelled)) == expected and len(ids) == len(expected)
    assert len(got.new_terms(seen)[0]) == 0  # all seen now


def test_a_full_term_set_starts_afresh_and_never_loses_a_new_id():
    seen = TermSet(slots_log2=4)  # 16 slots: 8 ids fit
    got = seen.add_new(np.array([5, 6, 5, 7, 8, 9, 10, 11, 12, 5]))
    assert got.tolist() == [0, 1, 3, 4, 5, 6, 7, 8, 9]  # 5 is new again once the set started afresh
    assert seen.add_new(np.array([5, 13])).tolist() == [1]
