"""Lucene BM25 scoring over in-memory shards, with exact dynamic pruning.

A shard (ShardIndex) is one slice of an index's documents as plain arrays: a CSC-like matrix over (term row, doc
ordinal) whose entries are impacts, each posting's precomputed BM25 contribution under corpus-wide statistics, so a
document's score does not depend on which shard holds it. A query (WeightedQuery) is a set of (term id, weight)
pairs; its score in a document is the fixed-point sum of weight x impact over its terms. The design notes sit in
the docstrings of the submodules they describe:

    formulas    idf, saturated tf and impacts; fixed-point scores (why every evaluation order gives the same bits)
    shard       ShardIndex; terms stored in two impact tiers
    doc_ids     doc ids as one Arrow string array and its buffers
    top_k       top_k_shards: a query batch over the shards of one index; which scorer "auto" picks
    pruning     the pruned scorer (exact MaxScore over all shards at once)
    exhaustive  the exhaustive scorer (dense accumulation)
    selection   selecting the k best hits, shared by both scorers
    merge       merge_top_k: per-shard top-k into the index's, by (score desc, doc id asc)

Measurements: docs/benchmarks.md ("Searcher at scale", "When pruning pays"). The tuning constants are re-exported
here for reading; a change must be made on the submodule that defines them (they are read there). numba caches each
kernel keyed by its own file only: after editing a kernel, delete this package's __pycache__ folder, or the kernels
of other modules that call it keep their old compiled copy.
"""

from sira.core.bm25.doc_ids import as_doc_id_array, doc_id_buffers, doc_ids_from_buffers
from sira.core.bm25.exhaustive import SAMPLE_STRIDE
from sira.core.bm25.formulas import (FIXED_POINT_BITS, IMPACT_DTYPE, MAX_SCORE, CorpusStats, WeightedQuery, idf,
                                     saturated_tf)
from sira.core.bm25.merge import merge_top_k
from sira.core.bm25.pruning import EXTEND_FRACTION, MERGE_RATIO, POOL_CAPACITY, PREFETCH_DISTANCE
from sira.core.bm25.selection import HISTOGRAM_K
from sira.core.bm25.shard import ROW_SAMPLE, TIER_MIN_POSTINGS, TIER_QUANTILE, ShardIndex, split_tiers, term_maxima
from sira.core.bm25.top_k import PRUNE_MAX_K, PRUNE_MAX_POSTINGS_PER_DOC, PRUNE_MIN_POSTINGS, top_k_shards

__all__ = [
    "IMPACT_DTYPE", "FIXED_POINT_BITS", "MAX_SCORE", "idf", "saturated_tf", "CorpusStats", "WeightedQuery",
    "ShardIndex", "term_maxima", "split_tiers", "as_doc_id_array", "doc_id_buffers", "doc_ids_from_buffers",
    "top_k_shards", "merge_top_k",
    "HISTOGRAM_K", "SAMPLE_STRIDE", "ROW_SAMPLE", "TIER_MIN_POSTINGS", "TIER_QUANTILE", "PRUNE_MAX_K",
    "PRUNE_MIN_POSTINGS", "PRUNE_MAX_POSTINGS_PER_DOC", "EXTEND_FRACTION", "POOL_CAPACITY", "PREFETCH_DISTANCE",
    "MERGE_RATIO",
]
