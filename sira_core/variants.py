"""The evaluation variants, in one table: what each one searches (the plain or the enriched index) and whether its
queries are expanded, read by `sira eval`, `sira run`, `sira sweep`, `sira report` and the CLI's help.

Four are one BM25 call each (`BM25(q_orig, d) + w * BM25(q_exp, d)` with or without either side's vocabulary);
sira+rerank is sira's top-k reordered by an LLM's judgments, never mixed into the single-call numbers.
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

    @property
    def first_stage(self) -> str:
        """The single-call variant that retrieves (a reranked variant reorders what it retrieves)."""
        return FIRST_STAGE_OF_RERANKED if self.reranked else self.name


BASELINE_VARIANT = "bm25"  # plain BM25: what `sira eval` runs unless told otherwise, the others are compared with
SIRA_VARIANT = "sira"  # both sides: the method itself, what a sweep tunes unless told otherwise
FIRST_STAGE_OF_RERANKED = SIRA_VARIANT

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("bm25", False, False, False, "plain"),
    Variant("doc", True, False, False, "corpus-side enrichment"),
    Variant("query", False, True, False, "query-side expansion over the plain index"),
    Variant("sira", True, True, False, "both sides"),
    Variant("sira+rerank", True, True, True, "sira, then an LLM judges its top-k (not a single call)"),
)}
VariantName = Literal["bm25", "doc", "query", "sira", "sira+rerank"]  # VARIANTS' names (tests/test_variants.py)
SingleCallVariant = Literal["bm25", "doc", "query", "sira"]
SINGLE_CALL_VARIANTS: tuple[str, ...] = tuple(n for n, v in VARIANTS.items() if not v.reranked)
RERANK_VARIANT = next(n for n, v in VARIANTS.items() if v.reranked)


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}") from None


def needs_enriched_index(names) -> bool:
    return any(variant(n).enriched_index for n in names)


def needs_expanded_queries(names) -> bool:
    return any(variant(n).expanded_queries for n in names)


def help_text(names=None) -> str:
    """"bm25: plain; doc: corpus-side enrichment; ..." for the given variants (all by default)."""
    return "; ".join(f"{n}: {VARIANTS[n].summary}" for n in (names or VARIANTS))
