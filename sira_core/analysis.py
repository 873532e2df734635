"""The one Analyzer: used identically at index time, for DF filtering and at query time.

text -> fold (NFKD, drop combining marks) -> lowercase -> tokenize -> possessives -> stopwords -> stem
     -> word n-grams (1..max_n, adjacent surviving tokens, joined by one space)

An n-gram term never crosses a phrase boundary: `terms_of_phrases` analyses each phrase on its own.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Iterable, Literal, Sequence

import numpy as np
import Stemmer
from pydantic import BaseModel, ConfigDict, Field

from sira_core.hashing import NGRAM_SEPARATOR, combine_term_ids, unigram_id

# Unicode word-boundary (UAX#29) approximation of Lucene's StandardTokenizer: letters and digits run
# together; a single '.', ':' or apostrophe joins two letters, a single '.', ',', ';' or apostrophe joins two
# digits ("u.s", "don't", "3.5", "1,000"); everything else splits ("il-6" -> "il", "6").
_UAX29_TOKEN = re.compile(
    r"[^\W_]+(?:(?:(?<=[^\W\d_])[.:'\u2019](?=[^\W\d_])|(?<=\d)[.,;'\u2019](?=\d))[^\W_]+)*"
)
_ALNUM_TOKEN = re.compile(r"[^\W_]+")
_ASCII_ALNUM_TOKEN = re.compile(r"[a-z0-9]+")
_POSSESSIVE = re.compile(r"['\u2019][sS]?$")


class AnalyzerConfig(BaseModel):
    """Everything that decides which terms a text produces. Stored with every index version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fold: bool = Field(True, description="NFKD-fold and drop combining marks (é -> e)")
    tokenizer: Literal["alnum", "uax29"] = Field(
        "alnum", description="alnum: split on non-alphanumerics; uax29: Lucene StandardTokenizer-like"
    )
    possessive: bool = Field(False, description="strip trailing 's (Lucene EnglishPossessiveFilter)")
    stopwords: Literal["none", "lucene", "nltk127"] = "nltk127"
    stemmer: Literal["none", "porter", "english"] = Field(
        "english", description="porter: Porter (Lucene PorterStemFilter); english: Snowball English"
    )
    max_n: int = Field(1, ge=1, le=4, description="word n-gram order of indexed terms")


@lru_cache(maxsize=None)
def load_stopwords(name: str) -> frozenset[str]:
    if name == "none":
        return frozenset()
    text = resources.files("sira_core").joinpath(f"resources/stopwords_{name}.txt").read_text("utf-8")
    return frozenset(w for line in text.splitlines() if not line.startswith("#") for w in line.split())


class Analyzer:
    """Turns text into index terms. Cheap to build; holds a stem cache, so keep one per process."""

    def __init__(self, config: AnalyzerConfig | None = None):
        self.config = config or AnalyzerConfig()
        c = self.config
        self._token_re = _UAX29_TOKEN if c.tokenizer == "uax29" else _ALNUM_TOKEN
        self._stopwords = load_stopwords(c.stopwords)
        self._stemmer = Stemmer.Stemmer(c.stemmer) if c.stemmer != "none" else None
        if self._stemmer is not None:
            self._stemmer.maxCacheSize = 200_000

    def normalize(self, text: str) -> str:
        if self.config.fold and not text.isascii():  # ASCII has nothing to decompose or drop
            text = _drop_combining_marks(unicodedata.normalize("NFKD", text))
        return text.lower()

    def word_to_token(self, word: str) -> str | None:
        """The token one normalised word becomes (possessive stripped, stemmed), None when it is dropped."""
        if self.config.possessive and ("'" in word or "\u2019" in word):
            word = _POSSESSIVE.sub("", word)
        if not word or word in self._stopwords:
            return None
        return self.stem([word])[0]

    def surface_words(self, text: str) -> list[str]:
        """Normalised words in order, stopwords removed, before stemming (what a reader would search for)."""
        words = self._token_re.findall(self.normalize(text))
        if self.config.possessive:
            words = [_POSSESSIVE.sub("", w) if "'" in w or "\u2019" in w else w for w in words]
        return [w for w in words if w and w not in self._stopwords]

    def stem(self, words: list[str]) -> list[str]:
        if self._stemmer is None:
            return list(words)
        if self.config.stemmer == "porter":
            # Lucene's PorterStemmer leaves words of 1-2 characters alone (PyStemmer maps "s" to "").
            return [w if len(w) <= 2 else self._stemmer.stemWord(w) for w in words]
        return self._stemmer.stemWords(words)

    def tokens(self, text: str) -> list[str]:
        """Stemmed unigram tokens in order (stopwords removed)."""
        return self.stem(self.surface_words(text))

    def terms(self, text: str) -> list[str]:
        """All index terms of one field or phrase: unigrams, then n-grams of adjacent tokens up to max_n."""
        return ngrams(self.tokens(text), self.config.max_n)

    def terms_of_phrases(self, phrases: Iterable[str]) -> list[str]:
        """Terms of several phrases, each analysed on its own (n-grams never span two phrases)."""
        out: list[str] = []
        for phrase in phrases:
            out.extend(self.terms(phrase))
        return out

    def term_counts(self, text: str) -> Counter[str]:
        return Counter(self.terms(text))


def _drop_combining_marks(text: str) -> str:
    """Delete the combining marks NFKD folding leaves (accents): one str.replace per distinct mark, found from
    the text's distinct characters, costs a few microseconds where a per-character loop costs ~100."""
    for mark in [ch for ch in set(text) if ch > "\u02ff" and unicodedata.combining(ch)]:
        text = text.replace(mark, "")
    return text


@dataclass(frozen=True)
class BatchTerms:
    """The terms of a batch of texts as arrays: doc i's distinct term ids are term_ids[offsets[i]:offsets[i+1]]
    (ascending) with their counts in tfs; doc_lens counts every term (n-grams included), as Analyzer.terms does.
    `vocab_ids` are the batch's distinct term ids (ascending); `vocab_terms(positions)` spells some of them."""

    offsets: np.ndarray
    term_ids: np.ndarray
    tfs: np.ndarray
    doc_lens: np.ndarray
    vocab_ids: np.ndarray
    _tokens: np.ndarray  # the batch's stem indices, stopwords removed
    _vocab_start: np.ndarray  # per vocab entry: where its first occurrence starts in _tokens ...
    _vocab_order: np.ndarray  # ... and how many tokens it joins
    _stems: list

    def vocab_terms(self, positions: np.ndarray) -> list[str]:
        stems, tokens = self._stems, self._tokens.tolist()
        return [NGRAM_SEPARATOR.join([stems[t] for t in tokens[s:s + n]])
                for s, n in zip(self._vocab_start[positions].tolist(), self._vocab_order[positions].tolist())]


class _WordCache(dict):
    """normalised word -> stem index (-1: dropped), computed on first sight."""

    def __init__(self, owner: "BatchAnalyzer"):
        super().__init__()
        self._owner = owner

    def __missing__(self, word: str) -> int:
        index = self._owner._stem_index_of(word)
        self[word] = index
        return index


class BatchAnalyzer:
    """Analyzer.terms for many texts at once, as arrays: what the index build runs over whole corpora.

    Per text, Python only finds the words and looks each up in a word cache (word -> stem index); stopwords,
    stemming and the unigram's hash happen once per distinct word. N-grams, their ids (`combine_term_ids`) and
    the per-document counts are numpy operations over the whole batch. The result equals Analyzer.terms
    (tests/test_analysis.py compares them). Keep one per process: the caches are what make it fast; they are
    emptied when they outgrow `cache_limit` words, so memory stays bounded on any corpus."""

    def __init__(self, config: AnalyzerConfig, cache_limit: int = 2_000_000):
        self.analyzer = Analyzer(config)
        self.cache_limit = cache_limit
        self._reset()

    def _reset(self) -> None:
        self._words = _WordCache(self)
        self._stem_of: dict[str, int] = {}
        self._stems: list[str] = []
        self._stem_ids = np.empty(4096, dtype=np.int64)

    def _stem_index_of(self, word: str) -> int:
        token = self.analyzer.word_to_token(word)
        if token is None:
            return -1
        index = self._stem_of.get(token)
        if index is None:
            index = self._stem_of[token] = len(self._stems)
            self._stems.append(token)
            if index == len(self._stem_ids):
                self._stem_ids = np.concatenate([self._stem_ids, np.empty_like(self._stem_ids)])
            self._stem_ids[index] = unigram_id(token)
        return index

    def analyze(self, texts: Sequence[str]) -> BatchTerms:
        if len(self._words) > self.cache_limit:
            self._reset()
        normalize, findall, lookup = self.analyzer.normalize, self.analyzer._token_re.findall, self._words.__getitem__
        # On lowercased ASCII the alnum tokenizer's class is [a-z0-9]: the same words, 1.5x faster to find.
        ascii_findall = _ASCII_ALNUM_TOKEN.findall if self.analyzer.config.tokenizer == "alnum" else findall
        flat: list[int] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            words = ascii_findall(text.lower()) if text.isascii() else findall(normalize(text))
            stems = list(map(lookup, words))
            flat.extend(stems)
            lengths[i] = len(stems)
        tokens = np.array(flat, dtype=np.int64)
        doc_of = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
        kept = tokens >= 0
        tokens, doc_of = tokens[kept], doc_of[kept]
        ids, docs, starts, orders = [self._stem_ids[tokens]], [doc_of], [np.arange(len(tokens))], [1]
        gram = ids[0]
        for n in range(2, self.analyzer.config.max_n + 1):
            m = len(tokens) - n + 1
            if m <= 0:
                break
            gram = combine_term_ids(gram[:m], ids[0][n - 1:])  # left fold: (t_i .. t_i+n-2) + t_i+n-1
            same_doc = doc_of[:m] == doc_of[n - 1:]
            ids.append(gram[same_doc])
            docs.append(doc_of[:m][same_doc])
            starts.append(np.flatnonzero(same_doc))
            orders.append(n)
        all_ids, all_docs = np.concatenate(ids), np.concatenate(docs)
        vocab_ids, local = np.unique(all_ids, return_inverse=True)
        first = np.empty(len(vocab_ids), dtype=np.int64)
        first[local[::-1]] = np.arange(len(local) - 1, -1, -1)  # reversed: the first occurrence writes last
        keys, tfs = np.unique(all_docs * max(len(vocab_ids), 1) + local, return_counts=True)
        doc_sorted = keys // max(len(vocab_ids), 1)
        flat_starts = np.concatenate(starts)
        order_of = np.repeat(np.array(orders), [len(s) for s in starts])
        return BatchTerms(
            offsets=np.searchsorted(doc_sorted, np.arange(len(texts) + 1)).astype(np.int64),
            term_ids=vocab_ids[keys % max(len(vocab_ids), 1)],
            tfs=tfs.astype(np.int32),
            doc_lens=np.bincount(all_docs, minlength=len(texts)).astype(np.int32),
            vocab_ids=vocab_ids,
            _tokens=tokens,
            _vocab_start=flat_starts[first],
            _vocab_order=order_of[first],
            _stems=self._stems,
        )


def index_text(title: str, text: str) -> str:
    """The one field that is indexed: title and text."""
    return f"{title} {text}" if title else text


def ngrams(tokens: list[str], max_n: int) -> list[str]:
    out = list(tokens)
    for n in range(2, max_n + 1):
        out.extend(NGRAM_SEPARATOR.join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return out

