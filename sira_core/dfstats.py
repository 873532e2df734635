"""Document-frequency statistics and the two SIRA DF filters.

Corpus side: a proposed phrase enters a document unless it is already there, repeats one of its own words, or its
rarest sub-n-gram is too common in the ORIGINAL corpus (min DF > tau*|C|); phrases unseen in the corpus are kept.
Query side: an expansion phrase is kept when any of its sub-n-grams exists in the enriched index and is
rare enough to discriminate (0 < DF <= tau*|C|).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from sira.core.analysis import Analyzer
from sira.core.hashing import term_id


@dataclass(frozen=True)
class PhraseDecision:
    phrase: str
    kept: bool
    reason: str  # kept | in document | repeats a word | too common | no terms
    min_df: int | None
    terms: tuple[str, ...]


def contains_sequence(tokens: Sequence[str], sub: Sequence[str]) -> bool:
    n = len(sub)
    return n > 0 and any(list(tokens[i : i + n]) == list(sub) for i in range(len(tokens) - n + 1))


@dataclass(frozen=True)
class PhraseCandidate:
    """A proposed phrase after the checks that need only the document: `reason` is set when the phrase is
    dropped whatever the corpus statistics ("no terms", "in document", "repeats a word"), None when the DF rule
    decides (`dropped_by_df`)."""

    phrase: str
    reason: str | None
    terms: tuple[str, ...]


def phrase_candidates(phrases: Sequence[str], doc_tokens: Sequence[str], analyzer: Analyzer) -> list[PhraseCandidate]:
    """The DF-independent half of the corpus-side filter. An index build keeps these per document (they change
    only with its text or its phrases) and applies the DF rule, which changes with the corpus, at every build.

    Repeats: a small model that loses its way writes "diabetes-related-diabetes-diabetes-diabetes" (one "word" to
    the parser). Its bigram "diabet diabet" is unseen, so the DF rule would keep it and inject "diabet" four times;
    no search phrase repeats its own word, so such a phrase is dropped whatever its DF."""
    out = []
    for phrase in phrases:
        tokens = analyzer.tokens(phrase)
        terms = tuple(analyzer.terms(phrase))
        if not terms:
            reason = "no terms"
        elif contains_sequence(doc_tokens, tokens):
            reason = "in document"
        elif len(set(tokens)) < len(tokens):
            reason = "repeats a word"
        else:
            reason = None
        out.append(PhraseCandidate(phrase, reason, terms))
    return out


def dropped_by_df(min_df: int, num_docs: int, tau: float) -> bool:
    """The DF rule of the corpus side: a phrase whose rarest sub-n-gram is in more than tau*|C| documents of the
    ORIGINAL corpus is too common to discriminate (phrases unseen there have min DF 0 and are kept)."""
    return min_df > tau * num_docs


def corpus_side_filter(
    phrases: Sequence[str],
    doc_tokens: Sequence[str],
    analyzer: Analyzer,
    df_lookup: Callable[[Sequence[str]], Mapping[str, int]],
    num_docs: int,
    tau: float,
) -> list[PhraseDecision]:
    """Decide each proposed phrase: dropped when already in the document (as a token sequence), when it repeats
    one of its own words, or when the smallest DF of its sub-n-grams in the ORIGINAL corpus exceeds tau*|C|;
    phrases unseen there are kept."""
    candidates = phrase_candidates(phrases, doc_tokens, analyzer)
    dfs = df_lookup(sorted({t for c in candidates if c.reason is None for t in c.terms}))
    out = []
    for c in candidates:
        if c.reason is not None:
            out.append(PhraseDecision(c.phrase, False, c.reason, None, c.terms))
            continue
        min_df = min(dfs.get(t, 0) for t in c.terms)
        kept = not dropped_by_df(min_df, num_docs, tau)
        out.append(PhraseDecision(c.phrase, kept, "kept" if kept else "too common", min_df, c.terms))
    return out


class DFTable:
    """Term id -> DF as two sorted arrays (no per-term Python objects: vocabularies with bigrams are big)."""

    def __init__(self, term_ids: np.ndarray, dfs: np.ndarray, num_docs: int):
        order = np.argsort(term_ids, kind="stable")
        self.term_ids = np.asarray(term_ids, dtype=np.int64)[order]
        self.dfs = np.asarray(dfs, dtype=np.int64)[order]
        self.num_docs = num_docs

    def of_ids(self, term_ids: np.ndarray, where: str = "the index") -> np.ndarray:
        """DF of each of `term_ids`, which must all be in the table."""
        if not len(term_ids):
            return np.empty(0, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.term_ids, term_ids), max(len(self.term_ids) - 1, 0))
        found = self.term_ids[pos] == term_ids if len(self.term_ids) else np.zeros(len(term_ids), bool)
        if not found.all():
            raise ValueError(f"{where}: {int((~found).sum())} term ids have postings but no term statistics")
        return self.dfs[pos]

    def lookup(self, terms: Sequence[str]) -> dict[str, int]:
        """DF of each term that the index holds (absent terms are left out: DF 0)."""
        if not len(self.term_ids) or not terms:
            return {}
        ids = np.array([term_id(t) for t in terms], dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.term_ids, ids), len(self.term_ids) - 1)
        hit = self.term_ids[pos] == ids
        return {t: int(df) for t, df, h in zip(terms, self.dfs[pos], hit) if h}


@dataclass(frozen=True)
class ExpansionDecision:
    phrase: str
    kept: bool
    reason: str  # kept | unseen | too common | no terms | duplicate
    terms: tuple[str, ...]
    dfs: tuple[int, ...]


def query_side_filter(
    phrases: Sequence[str],
    analyzer: Analyzer,
    df_lookup: Callable[[Sequence[str]], Mapping[str, int]],
    num_docs: int,
    tau: float,
) -> list[ExpansionDecision]:
    """Keep a phrase when ANY of its sub-n-grams has 0 < DF <= tau*|C| in the (enriched) index. A phrase with the
    same index terms as an earlier one ("Heart attacks" after "heart attack") is a duplicate: counted once."""
    limit = tau * num_docs
    terms_of = {p: tuple(analyzer.terms(p)) for p in phrases}
    dfs = df_lookup(sorted({t for ts in terms_of.values() for t in ts}))
    out, seen = [], set()
    for phrase in phrases:
        terms = terms_of[phrase]
        term_dfs = tuple(dfs.get(t, 0) for t in terms)
        if not terms:
            reason = "no terms"
        elif terms in seen:
            reason = "duplicate"
        elif any(0 < df <= limit for df in term_dfs):
            reason = "kept"
        elif not any(term_dfs):
            reason = "unseen"
        else:
            reason = "too common"
        seen.add(terms)
        out.append(ExpansionDecision(phrase, reason == "kept", reason, terms, term_dfs))
    return out
