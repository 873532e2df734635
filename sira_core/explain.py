"""Why a document ranked: its per-term contributions told apart by the query part they came from (the original
query or the expansion), the terms it holds only through corpus-side enrichment, and a snippet of its text
around the words that matched. Pure functions over a RetrievalProgram and what the index says of one hit."""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Mapping

from sira.core.analysis import NGRAM_SEPARATOR, Analyzer
from sira.core.program import RetrievalProgram

SNIPPET_WORDS = 40
SNIPPET_LEAD = 2  # words of context before the first match
_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")


def part_weights(program: RetrievalProgram) -> dict[str, tuple[float, float]]:
    """Each query term's weight in the original part and in the expansion part; their sum is the weight the
    compiled query gives it (sira.core.search.compile_query)."""
    weights: dict[str, list[float]] = {}
    for part in program.parts():
        side = 0 if part.name == "original" else 1
        for term, n in Counter(part.terms).items():
            weights.setdefault(term, [0.0, 0.0])[side] += part.weight * n
    return {t: (o, e) for t, (o, e) in weights.items()}


def explain_hit(program: RetrievalProgram, contributions: Mapping[str, float], doc_terms: Iterable[str],
                injected_phrases: Iterable[str], analyzer: Analyzer) -> list[dict]:
    """One row per term that scored, largest first: its contribution split into the original and the expansion
    part (in proportion to the term's weight in each), the kept expansion phrases that hold it, and whether the
    document holds it only through enrichment (`doc_terms`: the analysis of its own title and text), with the
    injected phrases it came from."""
    weights = part_weights(program)
    own = set(doc_terms)
    injected = [(phrase, set(analyzer.terms(phrase))) for phrase in injected_phrases]
    rows = []
    for term, score in sorted(contributions.items(), key=lambda kv: (-kv[1], kv[0])):
        original, expansion = weights.get(term, (1.0, 0.0))
        share = original / (original + expansion) if original + expansion > 0 else 1.0
        rows.append({
            "term": term, "score": score, "original": score * share, "expansion": score * (1.0 - share),
            "expansions": [e.phrase for e in program.expansions if e.kept and term in e.terms],
            "enrichment_only": term not in own,
            "injected": [phrase for phrase, terms in injected if term in terms],
        })
    return rows


def snippet(text: str, terms: Iterable[str], analyzer: Analyzer, words: int = SNIPPET_WORDS) -> list[dict]:
    """The stretch of `words` words of `text` holding the most words that analyse to one of `terms` (n-grams count
    by their words), as segments {"text", "match"} to show in order; "…" marks a cut."""
    wanted = {token for term in terms for token in term.split(NGRAM_SEPARATOR)}
    spans = [(m.start(), m.end(), bool(wanted & set(analyzer.tokens(m.group())))) for m in _WORD.finditer(text)]
    if not spans:
        return [{"text": text, "match": False}] if text else []
    hits = [int(match) for _, _, match in spans]
    window = min(words, len(spans))
    best, best_count, count = 0, sum(hits[:window]), sum(hits[:window])
    for start in range(1, len(spans) - window + 1):
        count += hits[start + window - 1] - hits[start - 1]
        if count > best_count:
            best, best_count = start, count
    if best_count:  # start two words before the first match (the window keeps every match it had)
        first = best + hits[best : best + window].index(1)
        best = min(max(best, first - SNIPPET_LEAD), len(spans) - window)
    chosen = spans[best : best + window]
    lo = 0 if best == 0 else chosen[0][0]
    hi = len(text) if best + window == len(spans) else chosen[-1][1]
    segments, at = [], lo
    for start, end, match in chosen:
        if match:
            segments += [(text[at:start], False), (text[start:end], True)]
            at = end
    segments.append((text[at:hi], False))
    if lo > 0:
        segments.insert(0, ("\u2026 ", False))
    if hi < len(text):
        segments.append((" \u2026", False))
    merged: list[dict] = []
    for piece, match in segments:
        if not piece:
            continue
        if merged and not match and not merged[-1]["match"]:
            merged[-1]["text"] += piece
        else:
            merged.append({"text": piece, "match": match})
    return merged
