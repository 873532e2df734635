"""Build shards in memory from (doc_id, title, text) rows: the Spark build's reference, for tests,
benchmarks and notebooks. Same analysis, same shard hash, same ordinals, same statistics."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

import numpy as np

from sira.core.analysis import Analyzer, index_text, ngrams
from sira.core.bm25 import CorpusStats, ShardIndex
from sira.core.defaults import DEFAULT_TAU
from sira.core.dfstats import corpus_side_filter
from sira.core.hashing import shard_of, term_id
from sira.core.presets import IndexPreset
from sira.core.search import Searcher


def build_searcher(docs: Iterable[tuple[str, str, str]], preset: IndexPreset, num_shards: int = 1,
                   phrases: Mapping[str, Sequence[str]] | None = None, tau: float = DEFAULT_TAU) -> Searcher:
    """With `phrases` (doc_id -> proposed phrases), the corpus-side filter and injection of the Spark build:
    a phrase enters its document unless already there or too common in the original corpus (DF > tau*|C|)."""
    analyzer = Analyzer(preset.analyzer)
    analysed: list[tuple[str, list[str], Counter]] = []
    df: Counter = Counter()
    for doc_id, title, text in docs:
        tokens = analyzer.tokens(index_text(title, text))
        counts = Counter(ngrams(tokens, analyzer.config.max_n))
        analysed.append((doc_id, tokens, counts))
        df.update(counts.keys())
    num_docs = len(analysed)
    if num_docs == 0:
        raise ValueError("no documents to index")
    per_shard: dict[int, list[tuple[str, Counter]]] = {s: [] for s in range(num_shards)}
    total = 0
    for doc_id, tokens, counts in analysed:
        proposed = (phrases or {}).get(doc_id)
        if proposed:
            for d in corpus_side_filter(list(proposed), tokens, analyzer, lambda ts: df, num_docs, tau):
                if d.kept:
                    counts.update(d.terms)
        per_shard[shard_of(doc_id, num_shards)].append((doc_id, counts))
        total += sum(counts.values())
    # BM25 scores with the DF of the indexed (enriched) field, as the Spark build does.
    indexed_df: Counter = Counter()
    for rows in per_shard.values():
        for _, counts in rows:
            indexed_df.update(counts.keys())
    stats = CorpusStats(num_docs, total / num_docs, preset.bm25.k1, preset.bm25.b)
    shards = [_shard_index(s, sorted(rows, key=lambda r: r[0]), indexed_df, stats) for s, rows in per_shard.items()]
    return Searcher(shards, stats, analyzer)


def _shard_index(shard: int, rows: list[tuple[str, Counter]], df: Counter, stats: CorpusStats) -> ShardIndex:
    postings: dict[int, tuple[str, list[int], list[int]]] = {}
    for ord_, (_, counts) in enumerate(rows):
        for term, tf in counts.items():
            postings.setdefault(term_id(term), (term, [], []))
            postings[term_id(term)][1].append(ord_)
            postings[term_id(term)][2].append(tf)
    tids = sorted(postings)
    lengths = [len(postings[t][1]) for t in tids]
    return ShardIndex.from_postings(
        shard=shard,
        doc_ids=np.array([r[0] for r in rows], dtype=object),
        doc_lens=np.array([sum(r[1].values()) for r in rows], dtype=np.int32),
        term_ids=np.array(tids, dtype=np.int64),
        dfs=np.array([df[postings[t][0]] for t in tids], dtype=np.int64),
        postings_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        postings_ords=np.array([o for t in tids for o in postings[t][1]], dtype=np.int32),
        postings_tfs=np.array([f for t in tids for f in postings[t][2]], dtype=np.int32),
        stats=stats,
    )
