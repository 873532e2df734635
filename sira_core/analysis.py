"""The one Analyzer: used identically at index time, for DF filtering and at query time.

text -> fold (NFKD, drop combining marks) -> lowercase -> tokenize -> possessives -> stopwords -> stem
     -> word n-grams (1..max_n, adjacent surviving tokens, joined by one space)

An n-gram term never crosses a phrase boundary: `terms_of_phrases` analyses each phrase on its own.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache
from importlib import resources
from typing import Iterable, Literal

import Stemmer
from pydantic import BaseModel, ConfigDict, Field

NGRAM_SEPARATOR = " "

# Unicode word-boundary (UAX#29) approximation of Lucene's StandardTokenizer: letters and digits run
# together; a single '.', ':' or apostrophe joins two letters, a single '.', ',', ';' or apostrophe joins two
# digits ("u.s", "don't", "3.5", "1,000"); everything else splits ("il-6" -> "il", "6").
_UAX29_TOKEN = re.compile(
    r"[^\W_]+(?:(?:(?<=[^\W\d_])[.:'\u2019](?=[^\W\d_])|(?<=\d)[.,;'\u2019](?=\d))[^\W_]+)*"
)
_ALNUM_TOKEN = re.compile(r"[^\W_]+")
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
        if self.config.fold:
            text = unicodedata.normalize("NFKD", text)
            text = "".join(ch for ch in text if not unicodedata.combining(ch))
        return text.lower()

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


def index_text(title: str, text: str) -> str:
    """The one field that is indexed: title and text."""
    return f"{title} {text}" if title else text


def ngrams(tokens: list[str], max_n: int) -> list[str]:
    out = list(tokens)
    for n in range(2, max_n + 1):
        out.extend(NGRAM_SEPARATOR.join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return out

