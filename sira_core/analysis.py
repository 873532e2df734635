"""The one Analyzer: used identically at index time, for DF filtering and at query time.

text -> fold (NFKD, drop combining marks) -> lowercase -> tokenize -> possessives -> stopwords -> stem
     -> word n-grams (1..max_n, adjacent surviving tokens, joined by one space)

An n-gram term never crosses a phrase boundary: `terms_of_phrases` analyses each phrase on its own.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Iterable, Literal, Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import Stemmer
from pydantic import BaseModel, ConfigDict, Field

from sira.core.hashing import NGRAM_SEPARATOR, unigram_id

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
    text = resources.files("sira.core").joinpath(f"resources/stopwords_{name}.txt").read_text("utf-8")
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


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


@lru_cache(maxsize=1)
def _bmp_combining_marks() -> re.Pattern:
    """A character class of the combining marks below U+10000, as ranges (built once). A regex deletes them in C;
    astral ranges would make every match slow, so those few marks are handled apart."""
    marks = [cp for cp in range(0x10000) if unicodedata.combining(chr(cp))]
    ranges, start = [], marks[0]
    for prev, cp in zip(marks, marks[1:] + [-1]):
        if cp != prev + 1:
            ranges.append(re.escape(chr(start)) + ("-" + re.escape(chr(prev)) if prev > start else ""))
            start = cp
    return re.compile("[" + "".join(ranges) + "]")


def _drop_combining_marks(text: str) -> str:
    """Delete the combining marks NFKD folding leaves (accents), as `not unicodedata.combining(ch)` would."""
    text = _bmp_combining_marks().sub("", text)
    if _ASTRAL.search(text):
        for mark in [ch for ch in set(text) if ch > "\uffff" and unicodedata.combining(ch)]:
            text = text.replace(mark, "")
    return text


@dataclass(frozen=True)
class BatchTerms:
    """The terms of a batch of texts as arrays: doc i's distinct term ids are term_ids[offsets[i]:offsets[i+1]]
    (ascending) with their counts in tfs; doc_lens counts every term (n-grams included), as Analyzer.terms does."""

    offsets: np.ndarray
    term_ids: np.ndarray
    tfs: np.ndarray
    doc_lens: np.ndarray
    _tokens: np.ndarray  # the batch's stem indices, stopwords removed
    _where: np.ndarray  # per term_ids entry: the token position where it starts ...
    _order: np.ndarray  # ... and how many tokens it joins
    _stems: list

    def new_terms(self, seen: "TermSet") -> tuple[np.ndarray, list[str]]:
        """The ids and spellings of the batch's terms that `seen` lacks (each once); they join `seen`."""
        positions = seen.add_new(self.term_ids)
        stems, tokens = self._stems, self._tokens.tolist()
        spelled = [NGRAM_SEPARATOR.join([stems[t] for t in tokens[s:s + n]])
                   for s, n in zip(self._where[positions].tolist(), self._order[positions].tolist())]
        return self.term_ids[positions], spelled


class TermSet:
    """A set of int64 term ids in an open-addressing table (compiled probes, no Python object per id), for "which
    of these millions of ids are new". It empties itself before it would fill past half its slots: a term is then
    new again, which costs a repeated row downstream, never a missing one."""

    def __init__(self, slots_log2: int = 23):
        self._bits = slots_log2
        self.clear()

    def clear(self) -> None:
        self._keys = np.zeros(1 << self._bits, dtype=np.uint64)
        self._used = np.zeros(1 << self._bits, dtype=np.bool_)
        self.size = 0

    def add_new(self, ids: np.ndarray) -> np.ndarray:
        """Positions in `ids` of the ids not in the set (the first of repeats), which are added."""
        ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
        found, start = [], 0
        while start < len(ids):
            room = len(self._keys) // 2 - self.size
            positions, start = _add_new(self._keys, self._used, ids, np.uint64(64 - self._bits), start, room)
            found.append(positions)
            self.size += len(positions)
            if start < len(ids):  # half full: start afresh
                self.clear()
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _add_new(keys, used, ids, shift, start, room):
    """Insert ids[start:] until `room` new ids went in; returns their positions and where it stopped."""
    out = np.empty(min(ids.size - start, room), dtype=np.int64)
    mask = np.uint64(keys.size - 1)
    n = 0
    i = start
    while i < ids.size and n < room:
        key = ids[i]
        slot = (key * np.uint64(0x9E3779B97F4A7C15)) >> shift  # multiplicative hashing: the top bits
        while used[slot] and keys[slot] != key:
            slot = (slot + np.uint64(1)) & mask
        if not used[slot]:
            used[slot] = True
            keys[slot] = key
            out[n] = i
            n += 1
        i += 1
    return out[:n], i


class _Memo(dict):
    """key -> compute(key), computed on first sight (word -> stem index, chunk -> chunk number)."""

    def __init__(self, compute):
        super().__init__()
        self._compute = compute

    def __missing__(self, key: str) -> int:
        value = self[key] = self._compute(key)
        return value


def _with_room(a: np.ndarray, size: int) -> np.ndarray:
    """`a`, or a copy doubled until it holds `size` entries (amortised growth of a store)."""
    if size <= len(a):
        return a
    grown = np.empty(max(size, 2 * len(a)), dtype=a.dtype)
    grown[: len(a)] = a
    return grown


class BatchAnalyzer:
    """Analyzer.terms for many texts at once, as arrays: what the index build runs over whole corpora.

    Arrow (C++) splits the batch's texts on ASCII whitespace and numbers the distinct chunks; Python sees each
    distinct chunk ("(IL-6)," is one) once per cache lifetime, finding its words and their stem indices as
    Analyzer.tokens would (stopwords, possessives and stemming once per distinct word). This equals analysing
    whole texts because no token, normalisation or casing rule spans ASCII whitespace: the tokenizers' classes
    and joiners exclude it, NFKD and its canonical reordering stop at it (a starter), and final-sigma casing
    treats it as a word boundary. N-grams, their ids (the fold of sira.core.hashing.combine_term_ids) and the
    per-document counts are one compiled pass over the batch. The result equals Analyzer.terms
    (tests/test_analysis.py compares them). Keep one per process: the caches are what make it fast; they are
    emptied when they outgrow `cache_limit` entries, so memory stays bounded on any corpus."""

    def __init__(self, config: AnalyzerConfig, cache_limit: int = 2_000_000):
        self.analyzer = Analyzer(config)
        self.cache_limit = cache_limit
        self._reset()

    def _reset(self) -> None:
        self._words = _Memo(self._stem_index_of)  # normalised word -> stem index (-1: dropped)
        self._stem_of: dict[str, int] = {}
        self._stems: list[str] = []
        self._stem_ids = np.empty(4096, dtype=np.int64)
        self._chunks = _Memo(self._add_chunk)  # whitespace-delimited chunk -> chunk number
        self._chunk_start = np.empty(4096, dtype=np.int64)  # chunk number -> its stem indices in _chunk_stems
        self._chunk_len = np.empty(4096, dtype=np.int64)
        self._chunk_stems = np.empty(16384, dtype=np.int64)
        self._chunk_stems_used = 0

    def _stem_index_of(self, word: str) -> int:
        token = self.analyzer.word_to_token(word)
        if token is None:
            return -1
        index = self._stem_of.get(token)
        if index is None:
            index = self._stem_of[token] = len(self._stems)
            self._stems.append(token)
            self._stem_ids = _with_room(self._stem_ids, index + 1)
            self._stem_ids[index] = unigram_id(token)
        return index

    def _add_chunk(self, chunk: str) -> int:
        """Number a new chunk and store the stem indices of the tokens it keeps."""
        a = self.analyzer
        # On lowercased ASCII the alnum tokenizer's class is [a-z0-9]: the same words, 1.5x faster to find.
        if chunk.isascii() and a.config.tokenizer == "alnum":
            words = _ASCII_ALNUM_TOKEN.findall(chunk.lower())
        else:
            words = a._token_re.findall(a.normalize(chunk))
        stems = [i for i in map(self._words.__getitem__, words) if i >= 0]
        number, used = len(self._chunks), self._chunk_stems_used
        self._chunk_start = _with_room(self._chunk_start, number + 1)
        self._chunk_len = _with_room(self._chunk_len, number + 1)
        self._chunk_stems = _with_room(self._chunk_stems, used + len(stems))
        self._chunk_stems[used:used + len(stems)] = stems
        self._chunk_start[number], self._chunk_len[number] = used, len(stems)
        self._chunk_stems_used = used + len(stems)
        return number

    def analyze(self, texts: Sequence[str] | pa.Array | pa.ChunkedArray) -> BatchTerms:
        """`texts`: str each (a list, or an Arrow string array: then no Python string per text is made)."""
        if len(self._words) > self.cache_limit or len(self._chunks) > self.cache_limit:
            self._reset()
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        if not isinstance(texts, pa.Array):
            texts = pa.array(texts, pa.large_string())
        if texts.null_count:
            raise ValueError(f"text {texts.is_null().index(True).as_py()} of the batch is null")
        parts = pc.ascii_split_whitespace(texts)
        encoded = pc.dictionary_encode(pc.list_flatten(parts))
        numbers = np.fromiter(map(self._chunks.__getitem__, encoded.dictionary.to_pylist()), dtype=np.int64,
                              count=len(encoded.dictionary))
        occurrences = numbers[encoded.indices.to_numpy(zero_copy_only=False)]
        lens, starts = self._chunk_len[occurrences], self._chunk_start[occurrences]
        per_doc = np.bincount(pc.list_parent_indices(parts).to_numpy(zero_copy_only=False), weights=lens,
                              minlength=len(texts)).astype(np.int64)
        # Each occurrence's stem indices, in order: a ragged gather from the chunk store.
        ends = np.cumsum(lens)
        tokens = self._chunk_stems[np.repeat(starts - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)]
        offsets, term_ids, tfs, where, order, doc_lens = _count_terms(
            np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64), self._stem_ids[tokens].view(np.uint64),
            self.analyzer.config.max_n)
        return BatchTerms(offsets=offsets, term_ids=term_ids, tfs=tfs, doc_lens=doc_lens, _tokens=tokens,
                          _where=where, _order=order, _stems=self._stems)


_GOLDEN_U = np.uint64(0x9E3779B97F4A7C15)
_OFFSET_U = np.uint64(0x632BE59BD9B4E019)
_MIX1_U = np.uint64(0xBF58476D1CE4E5B9)
_MIX2_U = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True, inline="always")
def _combine_u64(left, right):
    """sira.core.hashing's fold step on uint64 (kept in uint64 throughout: numba widens mixed signs to float)."""
    z = left * _GOLDEN_U + right + _OFFSET_U
    z = (z ^ (z >> np.uint64(30))) * _MIX1_U
    z = (z ^ (z >> np.uint64(27))) * _MIX2_U
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def _count_terms(tok_offsets, unigram_ids, max_n):
    """Per document (its tokens' unigram ids between tok_offsets[d] and [d+1]): every term (unigrams, then the
    n-grams of adjacent tokens up to max_n) counted. Returns offsets, term ids (ascending per document), tfs,
    for each entry a token position and order where that term occurs (to spell it), and each document's length."""
    n_docs = tok_offsets.size - 1
    longest = 0
    for d in range(n_docs):
        longest = max(longest, tok_offsets[d + 1] - tok_offsets[d])
    cap = unigram_ids.size * max_n
    buf = np.empty(longest * max_n, dtype=np.uint64)
    buf_pos = np.empty(longest * max_n, dtype=np.int64)
    buf_order = np.empty(longest * max_n, dtype=np.int8)
    offsets = np.empty(n_docs + 1, dtype=np.int64)
    out_ids = np.empty(cap, dtype=np.uint64)
    out_tfs = np.empty(cap, dtype=np.int32)
    out_pos = np.empty(cap, dtype=np.int64)
    out_order = np.empty(cap, dtype=np.int8)
    doc_lens = np.empty(n_docs, dtype=np.int32)
    k = 0
    for d in range(n_docs):
        a, b = tok_offsets[d], tok_offsets[d + 1]
        m = 0
        for n in range(1, max_n + 1):
            for i in range(a, b - n + 1):
                h = unigram_ids[i]
                for j in range(1, n):
                    h = _combine_u64(h, unigram_ids[i + j])
                buf[m] = h
                buf_pos[m] = i
                buf_order[m] = n
                m += 1
        doc_lens[d] = m
        offsets[d] = k
        # Term ids compare as signed int64 (the order the index keeps), so sort their signed view.
        idx = np.argsort(buf[:m].view(np.int64))
        i = 0
        while i < m:
            t = buf[idx[i]]
            j = i + 1
            while j < m and buf[idx[j]] == t:
                j += 1
            out_ids[k] = t
            out_tfs[k] = j - i
            out_pos[k] = buf_pos[idx[i]]
            out_order[k] = buf_order[idx[i]]
            k += 1
            i = j
    offsets[n_docs] = k
    return offsets, out_ids[:k].view(np.int64), out_tfs[:k], out_pos[:k], out_order[:k], doc_lens


def index_text(title: str, text: str) -> str:
    """The one field that is indexed: title and text."""
    return f"{title} {text}" if title else text


def ngrams(tokens: list[str], max_n: int) -> list[str]:
    out = list(tokens)
    for n in range(2, max_n + 1):
        out.extend(NGRAM_SEPARATOR.join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return out

