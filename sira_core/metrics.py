"""Retrieval metrics through ranx (trec_eval definitions), and TREC run I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ranx import Qrels, Run, evaluate

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


def write_trec_run(run: RunDict, path: str | Path, tag: str) -> None:
    """Standard 6-column TREC run: qid Q0 docno rank score tag."""
    lines = []
    for qid, hits in run.items():
        ranked = sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
        lines.extend(f"{qid} Q0 {doc} {rank} {score:.6f} {tag}" for rank, (doc, score) in enumerate(ranked, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
