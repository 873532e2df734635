"""Dense retrieval, the baseline an experimenter compares SIRA with first: exact inner product between unit query
vectors and the corpus's unit document vectors (cosine), and reciprocal-rank fusion of two runs (ranx).

Exact, not approximate: every document is scored. The document matrix is scanned in blocks, so the scores held at
once are (queries x DENSE_BLOCK_DOCS), not (queries x documents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

DENSE_BLOCK_DOCS = 65_536  # document rows scored per matrix product
RRF_K = 60  # reciprocal-rank fusion's constant (Cormack et al. 2009): a hit's share is 1 / (RRF_K + rank)

RunHits = dict[str, dict[str, float]]  # qid -> {doc_id: score}, each query's hits best first


@dataclass
class DenseIndex:
    doc_ids: list[str]
    vectors: np.ndarray  # (documents, dim) float32, unit rows, in doc_ids' order

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or len(self.doc_ids) != self.vectors.shape[0]:
            raise ValueError(f"{len(self.doc_ids)} doc ids for a vector matrix of shape {self.vectors.shape}")
        self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        self._row = {d: i for i, d in enumerate(self.doc_ids)}

    def search(self, queries: np.ndarray, k: int, exclude: Sequence[str | None] | None = None
               ) -> list[list[tuple[str, float]]]:
        """Each query vector's k best documents by inner product, best first (ties by row order); `exclude`: per
        query, a doc id that may not be among its hits (a query that is itself a document), or None."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        n, k = len(self.doc_ids), min(k, len(self.doc_ids))
        if n == 0 or k == 0:
            return [[] for _ in range(queries.shape[0])]
        banned = [self._row.get(d, -1) if d is not None else -1 for d in exclude] if exclude is not None else None
        best_rows = np.zeros((queries.shape[0], 0), np.int64)
        best_scores = np.zeros((queries.shape[0], 0), np.float32)
        for start in range(0, n, DENSE_BLOCK_DOCS):
            scores = queries @ self.vectors[start:start + DENSE_BLOCK_DOCS].T
            if banned is not None:
                for qi, row in enumerate(banned):
                    if start <= row < start + scores.shape[1]:
                        scores[qi, row - start] = -np.inf
            rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
            best_rows = np.concatenate([best_rows, rows], axis=1)
            best_scores = np.concatenate([best_scores, scores], axis=1)
            if best_scores.shape[1] > k:  # keep the block's k best (rows ascending inside, for stable ties)
                keep = np.sort(np.argpartition(-best_scores, k - 1, axis=1)[:, :k], axis=1)
                best_rows = np.take_along_axis(best_rows, keep, axis=1)
                best_scores = np.take_along_axis(best_scores, keep, axis=1)
        out = []
        for rows, scores in zip(best_rows, best_scores):
            order = np.lexsort((rows, -scores))
            out.append([(self.doc_ids[rows[i]], float(scores[i])) for i in order if np.isfinite(scores[i])])
        return out


def reciprocal_rank_fusion(runs: Sequence[Mapping[str, Mapping[str, float]]], k: int = RRF_K,
                           depth: int | None = None) -> RunHits:
    """ranx's RRF of `runs` (each qid -> {doc_id: score}) over the queries of any of them; a document's fused score
    is the sum of 1 / (k + its rank) in each run that holds it. Each query's hits best first, `depth` at most."""
    from ranx import Run, fuse

    qids = list(dict.fromkeys(q for run in runs for q in run))
    aligned = [Run({q: dict(run.get(q, {})) for q in qids}) for run in runs]
    fused = fuse(aligned, norm=None, method="rrf", params={"k": k}).to_dict()
    out: RunHits = {}
    for q in qids:
        ranked = sorted(fused.get(q, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        out[q] = dict(ranked[:depth] if depth is not None else ranked)
    return out
