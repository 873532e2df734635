"""Build shards in memory from (doc_id, title, text) rows: the Spark build's reference, for tests,
benchmarks and notebooks. Same analysis, same shard hash, same ordinals, same statistics."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import numpy as np

from sira_core.analysis import Analyzer, index_text
from sira_core.bm25 import CorpusStats, ShardIndex
from sira_core.hashing import shard_of, term_id
from sira_core.presets import IndexPreset
from sira_core.search import Searcher


def build_searcher(docs: Iterable[tuple[str, str, str]], preset: IndexPreset, num_shards: int = 1) -> Searcher:
    analyzer = Analyzer(preset.analyzer)
    per_shard: dict[int, list[tuple[str, Counter]]] = {s: [] for s in range(num_shards)}
    df: Counter = Counter()
    total = 0
    for doc_id, title, text in docs:
        counts = Counter(analyzer.terms(index_text(title, text)))
        per_shard[shard_of(doc_id, num_shards)].append((doc_id, counts))
        df.update(counts.keys())
        total += sum(counts.values())
    num_docs = sum(len(v) for v in per_shard.values())
    if num_docs == 0:
        raise ValueError("no documents to index")
    stats = CorpusStats(num_docs, total / num_docs, preset.bm25.k1, preset.bm25.b)
    shards = [_shard_index(s, sorted(rows, key=lambda r: r[0]), df, stats) for s, rows in per_shard.items()]
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
