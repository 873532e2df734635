"""The RetrievalProgram: one inspectable JSON object that says exactly what a query will do.

It holds the analysed original query, every proposed expansion phrase with its DF decision and reason,
the weights, and must-include / must-exclude constraints, and compiles into ONE call of the searcher:

    score(d) = BM25(q_orig, d) + w * sum over kept phrases p of weight_p * BM25(terms_p, d)

restricted to documents that hold every `must` term and no `exclude` term.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from sira.core.analysis import NGRAM_SEPARATOR, Analyzer
from sira.core.dfstats import ExpansionDecision, query_side_filter
from sira.core.proposers import Proposal
from sira.core.search import QueryPart

DEFAULT_W = 0.5


class Expansion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phrase: str
    kept: bool
    reason: str = Field(description="kept | unseen | too common | no terms | duplicate")
    terms: list[str]
    dfs: list[int] = Field(default_factory=list, description="DF of each term in the index")
    weight: float = Field(1.0, gt=0, description="the proposer's confidence, multiplied by w")
    proposer: str = ""


class RetrievalProgram(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str
    original_terms: list[str]
    expansions: list[Expansion] = Field(default_factory=list)
    w: float = Field(DEFAULT_W, ge=0)
    must: list[str] = Field(default_factory=list, description="index terms every hit must hold")
    exclude: list[str] = Field(default_factory=list, description="index terms no hit may hold")
    index_version: int | None = None
    prompt_version: str | None = None

    @classmethod
    def build(
        cls,
        query: str,
        analyzer: Analyzer,
        decisions: Sequence[ExpansionDecision] = (),
        w: float = DEFAULT_W,
        must: Sequence[str] = (),
        exclude: Sequence[str] = (),
        proposer: str = "",
        index_version: int | None = None,
        prompt_version: str | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> "RetrievalProgram":
        """`weights`: the proposer's confidence per phrase (the encoder's cosine); absent phrases weigh 1."""
        weights = weights or {}
        return cls(
            query=query,
            original_terms=analyzer.terms(query),
            expansions=[Expansion(phrase=d.phrase, kept=d.kept, reason=d.reason, terms=list(d.terms),
                                  dfs=list(d.dfs), weight=max(float(weights.get(d.phrase, 1.0)), 1e-6),
                                  proposer=proposer) for d in decisions],
            w=w,
            index_version=index_version,
            prompt_version=prompt_version,
        ).constrained(analyzer, must, exclude)

    def constrained(self, analyzer: Analyzer, must: Sequence[str] = (),
                    exclude: Sequence[str] = ()) -> "RetrievalProgram":
        """This program with more must-include / must-exclude constraint phrases."""
        return self.model_copy(update={
            "must": self.must + [t for text in must for t in constraint_terms(text, analyzer)],
            "exclude": self.exclude + [t for text in exclude for t in constraint_terms(text, analyzer)]})

    def parts(self) -> list[QueryPart]:
        """The weighted query parts of the single BM25 call."""
        parts = [QueryPart(tuple(self.original_terms), 1.0, "original")] if self.original_terms else []
        if self.w > 0:
            parts += [QueryPart(tuple(e.terms), self.w * e.weight, f"expansion:{e.phrase}")
                      for e in self.expansions if e.kept and e.terms]
        return parts


def constraint_terms(text: str, analyzer: Analyzer) -> list[str]:
    """A constraint phrase as index terms: its n-gram when the index holds n-grams that long, else every token."""
    tokens = analyzer.tokens(text)
    if not tokens:
        raise ValueError(f"constraint {text!r} has no index terms (only stopwords or punctuation?)")
    if 1 < len(tokens) <= analyzer.config.max_n:
        return [NGRAM_SEPARATOR.join(tokens)]
    return tokens


def expansion_program(
    query: str,
    analyzer: Analyzer,
    proposal: Proposal,
    df_lookup: Callable[[Sequence[str]], Mapping[str, int]],
    num_docs: int,
    tau: float,
    w: float = DEFAULT_W,
    proposer: str = "",
    index_version: int | None = None,
    prompt_version: str | None = None,
    must: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> RetrievalProgram:
    """A query's program from its proposal: query-side DF validation, then the weighted single call."""
    decisions = query_side_filter(proposal.phrases, analyzer, df_lookup, num_docs, tau)
    return RetrievalProgram.build(query, analyzer, decisions, w=w, must=must, exclude=exclude, proposer=proposer,
                                  index_version=index_version, prompt_version=prompt_version,
                                  weights=dict(zip(proposal.phrases, proposal.weights)))
