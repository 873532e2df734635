"""The evaluation variants, in one table: what each one searches (the plain or the enriched index) and whether its
queries are expanded, read by `sira eval`, `sira run`, `sira sweep`, `sira report` and the CLI's help.

Four are one BM25 call each (`BM25(q_orig, d) + w * BM25(q_exp, d)` with or without either side's vocabulary);
sira+rerank is sira's top-k reordered by an LLM's judgments, never mixed into the single-call numbers. The
baselines an experimenter compares first: dense (exact inner product over a sentence encoder's vectors), hybrid
(reciprocal-rank fusion of bm25 and dense), and sira+dense (sira fused with dense: what SIRA adds to a hybrid stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Variant:
    name: str
    enriched_index: bool  # searches the index with the corpus-side enrichment
    expanded_queries: bool  # adds the query-side expansion, weighted by w
    reranked: bool  # an LLM reorders the first stage's top-k: not a single BM25 call
    summary: str  # a few words for help texts and tables
    lexical: str | None  # the single-call BM25 variant whose ranking it uses (None: no BM25 part)
    dense: bool = False  # ranks by the encoder's document vectors (fused with `lexical` when both)

    @property
    def first_stage(self) -> str | None:
        """The BM25 variant that retrieves (a reranked variant reorders what it retrieves, a fused one fuses it)."""
        return self.lexical

    @property
    def single_call(self) -> bool:
        """One weighted BM25 call: what SIRA is, and what a sweep tunes."""
        return not self.reranked and not self.dense


BASELINE_VARIANT = "bm25"  # plain BM25: what `sira eval` runs unless told otherwise, the others are compared with
SIRA_VARIANT = "sira"  # both sides: the method itself, what a sweep tunes unless told otherwise

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("bm25", False, False, False, "plain", "bm25"),
    Variant("doc", True, False, False, "corpus-side enrichment", "doc"),
    Variant("query", False, True, False, "query-side expansion over the plain index", "query"),
    Variant("sira", True, True, False, "both sides", "sira"),
    Variant("sira+rerank", True, True, True, "sira, then an LLM judges its top-k (not a single call)", "sira"),
    Variant("dense", False, False, False, "exact inner product over the encoder's document vectors", None, True),
    Variant("hybrid", False, False, False, "reciprocal-rank fusion of bm25 and dense", "bm25", True),
    Variant("sira+dense", True, True, False, "reciprocal-rank fusion of sira and dense", "sira", True),
)}
VariantName = Literal["bm25", "doc", "query", "sira", "sira+rerank", "dense", "hybrid", "sira+dense"]  # VARIANTS'
SingleCallVariant = Literal["bm25", "doc", "query", "sira"]
SINGLE_CALL_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if v.single_call)
RERANK_VARIANT = next(n for n, v in VARIANTS.items() if v.reranked)
# What `sira run` evaluates unless told otherwise: everything but the LLM reranker (which needs a judge).
RUN_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.reranked)


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}") from None


def needs_enriched_index(names) -> bool:
    return any(variant(n).enriched_index for n in names)


def needs_expanded_queries(names) -> bool:
    return any(variant(n).expanded_queries for n in names)


def needs_embeddings(names) -> bool:
    return any(variant(n).dense for n in names)


def help_text(names=None) -> str:
    """"bm25: plain; doc: corpus-side enrichment; ..." for the given variants (all by default)."""
    return "; ".join(f"{n}: {VARIANTS[n].summary}" for n in (names or VARIANTS))
