"""Retrieval metrics through ranx (trec_eval definitions), and TREC run I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ranx import Qrels, Run, evaluate

from sira.core.defaults import PAIRED_PERMUTATIONS, SEARCH_K

DEFAULT_METRICS = ("ndcg@10", "recall@10", "recall@100")

RunDict = Mapping[str, Mapping[str, float]]


def evaluate_run(qrels: Mapping[str, Mapping[str, int]], run: RunDict, metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the judged queries; a judged query with no hits scores 0 (trec_eval -c)."""
    if not qrels:
        raise ValueError("qrels are empty")
    full_run = {qid: dict(run.get(qid, {})) for qid in qrels}
    # ranx rejects an empty ranking; a judged query without hits contributes 0 to every metric.
    empty = [qid for qid, hits in full_run.items() if not hits]
    scored = {qid: hits for qid, hits in full_run.items() if hits}
    if not scored:
        return {m: 0.0 for m in metrics}
    result = evaluate(Qrels.from_dict({q: dict(qrels[q]) for q in scored}), Run.from_dict(scored), list(metrics),
                      make_comparable=True)
    result = result if isinstance(result, dict) else {metrics[0]: result}
    scale = len(scored) / (len(scored) + len(empty))
    return {m: float(result[m]) * scale for m in metrics}


def _normalise(text: str) -> str:
    """Lowercase, punctuation to spaces, single spaces (the usual open-domain QA answer matching)."""
    import re
    import unicodedata

    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def answer_coverage(run: RunDict, answers: Mapping[str, Sequence[str]], passages: Mapping[str, str],
                    k: int = SEARCH_K) -> float:
    """Share of the queries with gold answers whose top-k passages contain any answer string (normalised,
    whole words). A query without hits counts as not covered."""
    if not answers:
        raise ValueError("no query carries gold answers")
    covered = 0
    for qid, golds in answers.items():
        targets = [f" {_normalise(a)} " for a in golds if _normalise(a)]
        top = sorted(run.get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        texts = [f" {_normalise(passages.get(doc, ''))} " for doc, _ in top]
        covered += any(t in text for t in targets for text in texts)
    return covered / len(answers)


def write_trec_run(run: RunDict, path: str | Path, tag: str) -> None:
    """Standard 6-column TREC run: qid Q0 docno rank score tag."""
    lines = []
    for qid, hits in run.items():
        ranked = sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
        lines.extend(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}" for rank, (doc, score) in enumerate(ranked, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    """A 6-column TREC run file -> {qid: {docno: score}}; a malformed line is a ValueError naming it."""
    run: dict[str, dict[str, float]] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 6:
                raise ValueError(f"{path}:{lineno}: expected 6 columns (qid Q0 docno rank score tag), got {len(parts)}")
            try:
                score = float(parts[4])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: score {parts[4]!r} is not a number") from None
            run.setdefault(parts[0], {})[parts[2]] = score
    return run


def paired_comparison(qrels: Mapping[str, Mapping[str, int]], base: RunDict, run: RunDict, metric: str = "ndcg@10",
                      permutations: int = PAIRED_PERMUTATIONS, seed: int = 0) -> dict:
    """`run` against `base` on the judged queries: both means, their difference, the two-sided paired
    randomization test's p, per-query wins / losses / ties and each query's two scores (`per_query`). A judged query
    missing from a run scores 0 there, as in evaluate_run.

    The test swaps the two systems' scores of each query at random (Fisher's randomization test, as ranx's
    "fisher"), here with numpy's seeded generator: ranx draws in parallel numba threads, whose random state its
    seed does not fix, so its p changed in the third decimal from one run to the next."""
    import numpy as np

    if not qrels:
        raise ValueError("qrels are empty")
    q = Qrels.from_dict({qid: dict(rel) for qid, rel in qrels.items()})
    # ranx rejects empty rankings: a query without hits gets one unjudged placeholder, which scores 0.
    placeholder = {"\x00no-hit": 0.0}
    qids = sorted(qrels)
    per_query = []
    for r in (base, run):
        ranked = Run.from_dict({qid: dict(r.get(qid) or placeholder) for qid in qids})
        evaluate(q, ranked, metric, make_comparable=True)  # fills ranked.scores[metric], keyed by query id
        per_query.append(np.array([ranked.scores[metric][qid] for qid in qids], dtype=np.float64))
    a, b = per_query
    diff = b - a
    observed = abs(diff.mean())
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, permutations, 1000):  # chunks keep the sign matrix small on large query sets
        signs = rng.choice((-1.0, 1.0), size=(min(1000, permutations - start), diff.size))
        extreme += int((np.abs(signs @ diff) / diff.size >= observed - 1e-12).sum())
    return {"metric": metric, "queries": int(diff.size), "base": float(a.mean()), "run": float(b.mean()),
            "delta": float(diff.mean()), "p_value": extreme / permutations, "permutations": permutations, "seed": seed,
            "wins": int((diff > 1e-9).sum()), "losses": int((diff < -1e-9).sum()),
            "ties": int((np.abs(diff) <= 1e-9).sum()),
            "per_query": {qid: {"base": float(x), "run": float(y)} for qid, x, y in zip(qids, a, b)}}
