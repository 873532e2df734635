"""The dense variants' retriever: the embedded encoder's vectors of an index version's documents (the
`doc_embeddings` table, sira.pipelines.enrichment.embeddings) searched by exact inner product with the queries'
vectors (sira.core.dense). Held in memory: 4 x 384 bytes a document (7.7 GB at 5M documents)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from sira.core.dense import DenseIndex, RunHits
from sira.core.defaults import QUERY_BATCH, SEARCH_K
from sira.core.proposers import DEFAULT_ENCODER


# Query vectors by text, shared by the retrievers of a process: `sira run` asks dense, hybrid and sira+dense for
# the same queries (arguana's 1,406 long ones: 95 s of encoding each time). Bounded: cleared when full.
_QUERY_VECTORS: dict[tuple[int, str], np.ndarray] = {}
QUERY_VECTOR_CACHE = 200_000


def query_vectors(encoder, texts: Sequence[str]) -> np.ndarray:
    """The encoder's vectors of `texts`, the ones asked before from the cache."""
    missing = list(dict.fromkeys(t for t in texts if (id(encoder), t) not in _QUERY_VECTORS))
    if len(_QUERY_VECTORS) + len(missing) > QUERY_VECTOR_CACHE:
        _QUERY_VECTORS.clear()
        missing = list(dict.fromkeys(texts))
    for text, vector in zip(missing, encoder.encode_queries(missing) if missing else ()):
        _QUERY_VECTORS[(id(encoder), text)] = vector
    return np.stack([_QUERY_VECTORS[(id(encoder), t)] for t in texts]) if texts else np.zeros((0, encoder.dim),
                                                                                             np.float32)


@dataclass
class DenseRetriever:
    index: DenseIndex
    encoder: object  # SentenceEncoder: texts -> unit vectors
    k: int = SEARCH_K
    exclude_self: bool = False  # a query's own id is never one of its hits
    batch_size: int = QUERY_BATCH  # queries encoded and scored together

    def run(self, queries: Mapping[str, str], on_batch: Callable[[list[str]], None] = lambda qids: None) -> RunHits:
        """qid -> {doc_id: score} of each query's k nearest documents, best first."""
        qids, texts, out = list(queries), list(queries.values()), {}
        for start in range(0, len(qids), self.batch_size):
            batch = qids[start:start + self.batch_size]
            vectors = query_vectors(self.encoder, texts[start:start + self.batch_size])
            hits = self.index.search(vectors, self.k, exclude=batch if self.exclude_self else None)
            out.update({q: dict(h) for q, h in zip(batch, hits)})
            on_batch(batch)
        return out


def open_dense(warehouse: str, manifest: dict, k: int = SEARCH_K, exclude_self: bool = False,
               model: str = DEFAULT_ENCODER) -> DenseRetriever:
    """A DenseRetriever over the documents of `manifest`'s docs table version (every one must have a vector from
    `model`)."""
    from sira.pipelines.enrichment.embeddings import DOCUMENT_MAX_TOKENS, encoder_id, load_vectors
    from sira.pipelines.enrichment.encoder_proposer import shared_encoder

    doc_ids, vectors = load_vectors(warehouse, int(manifest["docs_table_version"]),
                                    encoder_id(DOCUMENT_MAX_TOKENS, model))
    return DenseRetriever(DenseIndex(doc_ids, vectors), shared_encoder(DOCUMENT_MAX_TOKENS, model), k, exclude_self)
