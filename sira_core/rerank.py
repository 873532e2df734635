"""Pointwise LLM reranking, engine-free: the prompt, output parsing and the rule that merges the judgments into
the first-stage ranking.

The `sira+rerank` variant asks an LLM how relevant each of the first stage's top-k passages is to the query (an
integer 0-100, one call per (query, passage)) and reorders that block by the scores. It costs k LLM calls per
query, so it is a variant of its own, never mixed into the single-call numbers.

Merge rule (`rerank_order`): the first `depth` hits form the block; a hit whose judgment failed keeps its
first-stage slot; the judged hits fill the other slots of the block by score, ties in first-stage order; hits
below the block keep their first-stage order. So a judgment that failed never moves a document, and a reranker
that fails on everything returns the first-stage ranking unchanged.
"""

from __future__ import annotations

import json
import math
import re
from typing import Mapping, Sequence

from sira.core.enrichment import PromptTemplate, _first_json, load_template

RERANK_DEPTH = 20
MIN_SCORE, MAX_SCORE = 0, 100
RERANK_JSON_SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": MIN_SCORE, "maximum": MAX_SCORE}},
    "required": ["score"],
}
# Keys other than "score" that models use for the same number.
_SCORE_KEYS = ("score", "relevance", "relevance_score", "rating")
_NUMBER = re.compile(r"\s*-?\d+(?:\.\d+)?\s*")
_PLACEHOLDER = re.compile(r"\{(query|passage)\}")


def load_rerank_template() -> PromptTemplate:
    """The pointwise relevance prompt (generic: relevance to a query reads the same across tasks). Its version
    (`rerank-generic-<hash>`) keys the cached judgments, so editing it invalidates exactly those."""
    return load_template("rerank", "generic")


def render_judgment(template: PromptTemplate, query: str, passage: str) -> str:
    # One pass: a query that contains "{passage}" is not expanded again.
    values = {"query": query, "passage": passage}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template.text)


def parse_score(raw: str | None) -> tuple[int | None, str | None]:
    """The relevance score in an LLM's output, and an error when there is none. Never raises.

    Accepts {"score": 73} (or relevance / relevance_score / rating), inside code fences or prose, and a bare
    number. A fractional score is rounded; a score outside 0..100 is rejected, not clamped: a model that left
    the scale did not follow the prompt, and its number is not comparable with the others."""
    if raw is None or not raw.strip():
        return None, "empty output"
    try:
        value = float(raw) if _NUMBER.fullmatch(raw) else _first_json(raw)
    except RecursionError:
        return None, f"JSON nested too deeply in output: {raw[:80]!r}"
    if value is None:
        return None, f"no JSON found in output: {raw[:80]!r}"
    if isinstance(value, dict):
        key = next((k for k in _SCORE_KEYS if k in value), None)
        if key is None:
            return None, f"JSON has no score: {json.dumps(value)[:80]}"
        value = value[key]
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, f"score is not a number: {json.dumps(value)[:80]}"
    if not MIN_SCORE <= value <= MAX_SCORE:
        return None, f"score {value:g} outside {MIN_SCORE}..{MAX_SCORE}"
    return int(round(value)), None


def rerank_order(first_stage: Sequence[str], scores: Mapping[str, int | None], depth: int) -> list[str]:
    """One query's final ranking: the first `depth` doc ids of `first_stage` reordered by `scores` (a missing or
    None score is a failed judgment: the doc keeps its slot); deeper doc ids follow unchanged."""
    block = list(first_stage[:depth])
    # sorted() is stable: judged docs with equal scores keep their first-stage order.
    judged = iter(sorted((d for d in block if scores.get(d) is not None), key=lambda d: -scores[d]))
    return [d if scores.get(d) is None else next(judged) for d in block] + list(first_stage[depth:])
