"""The searcher at scale: our sharded, pruned, memory-mapped searcher against bm25s on the synthetic corpus.

    python bench/searcher_scale.py --docs 200000 [--shards 4] [--preset sira]
                                   [--output-json bench/results/searcher_scale_200k.json]

`measure_searcher(num_docs, ...)` returns the report (bench/scale.py imports it); its top-level
`query_ratio_vs_bm25s_numba`, `k1000_ratio_vs_bm25s_numba` and `memory_ratio_vs_bm25s` are issue 19's targets.

1. Analysis (this process, kept under --work-dir for later runs): documents `iter_documents(num_docs, seed)`
   of bench/synthetic_corpus.py, `index_text(title, text)` through the preset's Analyzer, as the Spark
   build; per document its distinct term ids (sira.core.hashing.term_id) and tfs; the term strings; the 300
   scifact test queries through the same Analyzer.
2. `sira-build` (subprocess): our shards from those arrays (`build_shards`, numpy: same shard hash, doc
   ordinals, N, avgdl and df as sira.core.memory_index) written to a shard cache (sira.pipelines.serving.shard_cache):
   the cold load. Then the expansion terms, by pseudo-relevance feedback: for each query, the terms of its
   FEEDBACK_DOCS best documents (plain query) with 0 < df <= TAU * N that the query lacks, most feedback
   documents first (then rarer first, then term id), 30 to 60 of them (seeded per query), at weight 0.5.
3. `bm25s-build` (subprocess): `bm25s.BM25(method="lucene")` over the same terms (its own `index()`, fed
   token ids), saved in bm25s's format.
4. `sira` and `bm25s-numba` (a subprocess each, one thread): load (ours: map the cache, checksums
   verified; bm25s: `BM25.load`), time every (k, plain | expanded) over the whole query set (best of
   --repeats, as bench/query_speed.py), keep the plain top-10 for the agreement check, and measure memory.

Timed calls. Ours: `Searcher.rank_many(compiled queries, k)` over all shards (shards in turn, each passing
its k-th best on as the next one's floor; merge; columnar results, doc ids not decoded; `k1000_with_doc_ids`
decodes them too), with the searcher's default `scorer="auto"`, and forced "pruned" and "exhaustive" (the
pruning speed-up is exhaustive over pruned). bm25s: `retrieve(token id lists, k, n_threads=1)` (one numba
call for the batch). Queries are compiled / mapped to ids beforehand for both. bm25s has no term weights: its
expanded queries score the same terms unweighted (the same postings work). Every scorer's rankings are
checked against exhaustive scoring (`pruned_equals_exhaustive`: the fraction of identical rankings).

Memory. Each engine's resident index is its process's RSS after loading the index, running the queries and,
for ours, touching every page of the mapped arrays (so all of it counts), minus the RSS before loading
(libraries imported, scoring kernels compiled on a toy index). Per posting: that over the number of
postings (the same in both). bm25s's includes its vocabulary dict (it needs it to map query strings);
`index_bytes_per_posting` also gives the arrays alone (ours: every array, doc ids included; bm25s: data,
indices, indptr).
"""

from __future__ import annotations

import os

# Single thread everywhere; these must be set before numpy / numba are first imported.
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("DISABLE_TQDM", "1")

import argparse
import json
import shutil
import subprocess
import sys
import time
from array import array
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.query_speed import (  # noqa: E402
    EMPTY_QUERY_TERM, SCORE_RTOL, best_time, machine_info, peak_rss_bytes, rss_bytes_now, write_json)

SEED = 7
KS = (10, 100, 1000)
KINDS = ("plain", "expanded")
TAU = 0.05
FEEDBACK_DOCS = 10
EXPANSION_TERMS = (30, 60)
EXPANSION_WEIGHT = 0.5
AGREEMENT_K = 10
SCORERS = ("auto", "pruned", "exhaustive")  # auto first: it is what the searcher uses
WORKERS = ("sira-build", "bm25s-build", "sira", "bm25s-numba")


# ---------------------------------------------------------------------------------------------------------
# The analysed corpus, kept as arrays.
# ---------------------------------------------------------------------------------------------------------


def corpus_folder(work_dir: Path, num_docs: int, seed: int, preset: str) -> Path:
    return work_dir / f"synthetic-{num_docs}-s{seed}-{preset}"


def analyse_corpus(folder: Path, num_docs: int, seed: int, preset_name: str) -> None:
    """Arrays of the analysed corpus (doc-major postings: term id, tf), term strings, queries; written once."""
    if (folder / "complete.json").exists():
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.synthetic_corpus import iter_documents
    from sira.core.analysis import Analyzer, index_text
    from sira.core.datasets import resolve_dataset
    from sira.core.hashing import term_id
    from sira.core.presets import get_preset

    analyzer = Analyzer(get_preset(preset_name).analyzer)
    ids_of: dict[str, int] = {}
    term_ids, tfs, doc_lens, doc_ptr = array("q"), array("i"), array("i"), array("q", [0])
    started = time.perf_counter()
    for n, (_, title, text) in enumerate(iter_documents(num_docs, seed), 1):
        terms = analyzer.terms(index_text(title, text))
        for term, tf in Counter(terms).items():
            tid = ids_of.get(term)
            if tid is None:
                tid = ids_of[term] = term_id(term)
            term_ids.append(tid)
            tfs.append(tf)
        doc_lens.append(len(terms))
        doc_ptr.append(len(term_ids))
        if n % 50_000 == 0:
            print(f"analysed {n:,} documents in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    vocab_ids = np.fromiter(ids_of.values(), dtype=np.int64, count=len(ids_of))
    order = np.argsort(vocab_ids)
    if len(np.unique(vocab_ids)) != len(vocab_ids):
        raise RuntimeError("term id hash collision in this corpus")
    folder.mkdir(parents=True, exist_ok=True)
    for name, values in (("term_ids", np.frombuffer(term_ids, np.int64)), ("tfs", np.frombuffer(tfs, np.int32)),
                         ("doc_lens", np.frombuffer(doc_lens, np.int32)), ("doc_ptr", np.frombuffer(doc_ptr, np.int64)),
                         ("vocab_ids", vocab_ids[order])):
        np.save(folder / f"{name}.npy", values)
    terms = list(ids_of)
    pq.write_table(pa.table({"term": pa.array([terms[i] for i in order], pa.large_string())}), folder / "vocab.parquet")
    queries = resolve_dataset("beir:scifact").queries("test")
    (folder / "queries.json").write_text(json.dumps(
        {"plain": {qid: analyzer.terms(text) for qid, text in queries.items()}}), encoding="utf-8")
    (folder / "complete.json").write_text(json.dumps(
        {"num_docs": num_docs, "seed": seed, "preset": preset_name, "analysis_seconds": time.perf_counter() - started}))


def load_corpus(folder: Path) -> dict:
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r")
              for name in ("term_ids", "tfs", "doc_lens", "doc_ptr", "vocab_ids")}
    return {**arrays, "meta": json.loads((folder / "complete.json").read_text())}


def vocab_terms(folder: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(folder / "vocab.parquet").column("term").to_pylist()


def read_queries(folder: Path) -> dict:
    """{"plain": {qid: terms}, "expansion": {qid: terms}} (expansion once sira-build has written it)."""
    out = json.loads((folder / "queries.json").read_text(encoding="utf-8"))
    if (folder / "expansions.json").exists():
        out["expansion"] = json.loads((folder / "expansions.json").read_text(encoding="utf-8"))
    return out


# ---------------------------------------------------------------------------------------------------------
# Our index, built with numpy from the arrays.
# ---------------------------------------------------------------------------------------------------------


def build_shards(corpus: dict, num_shards: int, k1: float, b: float):
    """ShardIndex per shard, as sira.core.memory_index.build_searcher would build it from the same documents
    (shard = shard_of(doc id), ordinals in doc-id order, corpus-wide N, avgdl and df), in numpy.
    Returns (shards, stats, vocabulary term ids, their df)."""
    from bench.synthetic_corpus import doc_id_of
    from sira.core.bm25 import CorpusStats, ShardIndex
    from sira.core.hashing import shard_of

    n = len(corpus["doc_lens"])
    doc_ids = [doc_id_of(i) for i in range(n)]  # zero-padded: number order is doc-id order
    shard_of_doc = np.fromiter((shard_of(d, num_shards) for d in doc_ids), dtype=np.int32, count=n)
    per_doc = np.diff(corpus["doc_ptr"])
    doc_of_posting = np.repeat(np.arange(n, dtype=np.int32), per_doc)
    stats = CorpusStats(n, float(np.sum(corpus["doc_lens"], dtype=np.int64)) / n, k1, b)
    sorted_shards = []
    for s in range(num_shards):
        docs = np.flatnonzero(shard_of_doc == s)
        ord_of_doc = np.full(n, -1, dtype=np.int32)
        ord_of_doc[docs] = np.arange(len(docs), dtype=np.int32)
        sel = np.flatnonzero(shard_of_doc[doc_of_posting] == s)
        terms = np.asarray(corpus["term_ids"][sel])
        order = np.argsort(terms, kind="stable")  # postings come in doc order: stable keeps ordinals ascending
        terms = terms[order]
        uniq, starts, shard_df = np.unique(terms, return_index=True, return_counts=True)
        sorted_shards.append((docs, uniq, np.append(starts, len(terms)), shard_df,
                              ord_of_doc[doc_of_posting[sel[order]]], np.asarray(corpus["tfs"][sel[order]])))
        del terms, order, sel
    vocab, inverse = np.unique(np.concatenate([u for _, u, *_ in sorted_shards]), return_inverse=True)
    df = np.bincount(inverse, weights=np.concatenate([d for *_, d, _, _ in sorted_shards])).astype(np.int64)
    shards = []
    for s, (docs, uniq, offsets, _, ords, tfs) in enumerate(sorted_shards):
        shards.append(ShardIndex.from_postings(
            s, [doc_ids[i] for i in docs], np.asarray(corpus["doc_lens"])[docs], uniq,
            df[np.searchsorted(vocab, uniq)], offsets, ords, tfs, stats))
        sorted_shards[s] = None  # let the sorted postings go as each shard is built
    return shards, stats, vocab, df


def cache_manifest(meta: dict, num_shards: int) -> dict:
    """What identifies the benchmark index in the shard cache (in place of a corpus_stats row)."""
    return {"index_version": 1, "synthetic_docs": meta["num_docs"], "seed": meta["seed"], "preset": meta["preset"],
            "num_shards": num_shards}


def pseudo_relevance_expansions(searcher, corpus: dict, vocab: np.ndarray, df: np.ndarray, terms: list[str],
                                plain: dict[str, list[str]], seed: int) -> dict[str, list[str]]:
    """Per query: 30-60 terms of its FEEDBACK_DOCS best documents with 0 < df <= TAU * N, absent from the query."""
    from sira.core.hashing import term_id

    limit = TAU * len(corpus["doc_lens"])
    out = {}
    rankings = searcher.rank_many([" ".join(t) for t in plain.values()], FEEDBACK_DOCS)
    for i, ((qid, query_terms), ranking) in enumerate(zip(plain.items(), rankings)):
        docs = [int(d[3:]) for d in ranking.doc_ids.to_pylist()]  # syn000000123 -> 123
        found = np.concatenate([corpus["term_ids"][corpus["doc_ptr"][d]: corpus["doc_ptr"][d + 1]] for d in docs]
                               + [np.empty(0, np.int64)])
        cand, feedback = np.unique(found, return_counts=True)
        cand_df = df[np.searchsorted(vocab, cand)]
        keep = (cand_df <= limit) & ~np.isin(cand, [term_id(t) for t in query_terms])
        cand, feedback, cand_df = cand[keep], feedback[keep], cand_df[keep]
        best = np.lexsort((cand, cand_df, -feedback))
        n = int(np.random.default_rng([seed, i]).integers(EXPANSION_TERMS[0], EXPANSION_TERMS[1] + 1))
        out[qid] = [terms[j] for j in np.searchsorted(vocab, cand[best[:n]])]
    return out


# ---------------------------------------------------------------------------------------------------------
# Workers.
# ---------------------------------------------------------------------------------------------------------


def worker_sira_build(folder: Path, work_dir: Path, num_shards: int, preset_name: str) -> dict:
    from sira.pipelines.serving import shard_cache
    from sira.core.analysis import Analyzer
    from sira.core.presets import get_preset
    from sira.core.search import Searcher

    preset = get_preset(preset_name)
    corpus = load_corpus(folder)
    started = time.perf_counter()
    shards, stats, vocab, df = build_shards(corpus, num_shards, preset.bm25.k1, preset.bm25.b)
    built = time.perf_counter()
    manifest = cache_manifest(corpus["meta"], num_shards)
    fingerprint = shard_cache.manifest_fingerprint(manifest)
    root = work_dir / "shard-cache"
    for shard in shards:
        folder_s = shard_cache.shard_dir("bench", manifest, shard.shard, root)
        shutil.rmtree(folder_s, ignore_errors=True)  # a previous run's: the cold load is timed again
        folder_s.parent.mkdir(parents=True, exist_ok=True)
        shard_cache.write_shard(folder_s, shard, fingerprint)
    written = time.perf_counter()
    result = {"build_from_arrays_seconds": built - started, "cache_write_seconds": written - built,
              "load_cold_seconds": written - started, "peak_rss_bytes": peak_rss_bytes(),
              "num_postings": sum(len(s.doc_ords) for s in shards), "num_terms_per_shard": [len(s.term_ids) for s in shards],
              "vocabulary": len(vocab), "avgdl": stats.avgdl}
    if not (folder / "expansions.json").exists():
        searcher = Searcher(shards, stats, Analyzer(preset.analyzer))
        expansions = pseudo_relevance_expansions(searcher, corpus, vocab, df, vocab_terms(folder),
                                                 read_queries(folder)["plain"], corpus["meta"]["seed"])
        (folder / "expansions.json").write_text(json.dumps(expansions), encoding="utf-8")
    return result


def worker_sira(folder: Path, work_dir: Path, num_shards: int, preset_name: str, ks, repeats, min_seconds) -> dict:
    from sira.pipelines.serving import shard_cache
    from sira.core.analysis import Analyzer
    from sira.core.bm25 import CorpusStats, ShardIndex
    from sira.core.presets import get_preset
    from sira.core.search import QueryPart, Searcher, compile_query

    preset = get_preset(preset_name)
    corpus_meta = json.loads((folder / "complete.json").read_text())
    # Compile the kernels (or load them from numba's cache) on a toy shard, so the baseline holds them.
    toy = ShardIndex(0, ["a", "b"], np.ones(2), np.array([1]), np.array([0, 2]), np.array([0, 1]),
                     np.ones(2, np.float32))
    toy_query = compile_query([QueryPart(("x",))])
    for scorer in SCORERS:
        toy.top_k_many([toy_query], 1, scorer=scorer)
    rss_before = rss_bytes_now()
    manifest = cache_manifest(corpus_meta, num_shards)
    fingerprint = shard_cache.manifest_fingerprint(manifest)
    root = work_dir / "shard-cache"
    started = time.perf_counter()
    shards = [shard_cache.open_shard(shard_cache.shard_dir("bench", manifest, s, root), s, fingerprint)
              for s in range(num_shards)]
    n = sum(s.num_docs for s in shards)
    avgdl = float(sum(int(np.sum(s.doc_lens, dtype=np.int64)) for s in shards)) / n
    searcher = Searcher(shards, CorpusStats(n, avgdl, preset.bm25.k1, preset.bm25.b), Analyzer(preset.analyzer))
    load_warm = time.perf_counter() - started
    rss_after_load = rss_bytes_now()
    queries = read_queries(folder)
    compiled = {"plain": [compile_query([QueryPart(tuple(t))]) for t in queries["plain"].values()],
                "expanded": [compile_query([QueryPart(tuple(t)), QueryPart(tuple(queries["expansion"][q]),
                                                                          EXPANSION_WEIGHT, "expansion")])
                             for q, t in queries["plain"].items()]}
    timings, exact = {}, {}
    for kind in KINDS:
        for k in ks:
            qs = compiled[kind]
            seconds = {scorer: best_time(lambda: searcher.rank_many(qs, k, scorer=scorer), repeats, min_seconds)[0]
                       for scorer in SCORERS}
            timings[f"{kind}_k{k}"] = {"qps": len(qs) / seconds["auto"],
                                       **{f"{scorer}_qps": len(qs) / seconds[scorer] for scorer in SCORERS[1:]},
                                       "pruning_speedup": seconds["exhaustive"] / seconds["pruned"]}
            reference = searcher.rank_many(qs, k, scorer="exhaustive")
            exact[f"{kind}_k{k}"] = min(
                sum(x.doc_ids.equals(y.doc_ids) and np.array_equal(x.scores, y.scores)
                    for x, y in zip(searcher.rank_many(qs, k, scorer=scorer), reference)) / len(qs)
                for scorer in ("auto", "pruned"))
        qs = compiled[kind]
        # What a caller gets (the Retriever's scorer call): the batch's hits with their doc ids, gathered at once.
        with_ids, _ = best_time(lambda: searcher.rank_many(qs, 1000, as_rankings=False), repeats, min_seconds)
        timings[f"{kind}_k1000_with_doc_ids"] = {"qps": len(qs) / with_ids}
    top = [([int(d[3:]) for d in r.doc_ids.to_pylist()], r.scores.tolist())
           for r in searcher.rank_many(compiled["plain"], AGREEMENT_K)]
    rss_after_queries = rss_bytes_now()
    for shard in shards:  # every page of every mapped array, so that all of the index counts as resident
        for values in shard.arrays().values():
            flat = values.reshape(-1).view(np.uint8)
            int(flat[:: 4096].sum())
    rss_full = rss_bytes_now()
    postings = sum(len(s.doc_ords) for s in shards)
    return {"load_warm_seconds": load_warm, "timings": timings, "pruned_equals_exhaustive": exact, "top": top,
            "num_postings": postings, "index_bytes": sum(s.nbytes() for s in shards),
            "rss_before_bytes": rss_before, "rss_after_load_bytes": rss_after_load,
            "rss_after_queries_bytes": rss_after_queries, "rss_all_pages_bytes": rss_full,
            "resident_index_bytes": rss_full - rss_before, "peak_rss_bytes": peak_rss_bytes(),
            "query_terms": {kind: float(np.mean([len(q.term_ids) for q in compiled[kind]])) for kind in KINDS}}


class TokenIdLists:
    """Each document's token ids with repetition (tf times), made when bm25s asks for it: a Python list of
    ints for all of a million documents at once would take tens of GB."""

    def __init__(self, corpus: dict, vocab_index: np.ndarray):
        self.ptr, self.ids, self.tfs = corpus["doc_ptr"], vocab_index, corpus["tfs"]

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def __getitem__(self, i: int) -> list[int]:
        if i >= len(self):
            raise IndexError(i)
        lo, hi = self.ptr[i], self.ptr[i + 1]
        return np.repeat(self.ids[lo:hi], self.tfs[lo:hi]).tolist()


def bm25s_dir(work_dir: Path, folder: Path) -> Path:
    return work_dir / f"bm25s-{folder.name}"


def worker_bm25s_build(folder: Path, work_dir: Path, preset_name: str) -> dict:
    """bm25s's index of the analysed corpus, built once (a later run of the same corpus reuses it)."""
    import bm25s
    from bm25s.tokenization import Tokenized

    from sira.core.presets import get_preset

    built_file = bm25s_dir(work_dir, folder) / "sira_bench_build.json"
    if built_file.exists():
        return json.loads(built_file.read_text())
    preset = get_preset(preset_name)
    corpus = load_corpus(folder)
    terms = vocab_terms(folder)
    vocab = {t: i for i, t in enumerate(terms)}
    vocab[EMPTY_QUERY_TERM] = len(vocab)  # see bench/query_speed.build_bm25s
    vocab_index = np.searchsorted(corpus["vocab_ids"], corpus["term_ids"]).astype(np.int32)
    started = time.perf_counter()
    model = bm25s.BM25(method="lucene", k1=preset.bm25.k1, b=preset.bm25.b, backend="numba")
    model.index(Tokenized(ids=TokenIdLists(corpus, vocab_index), vocab=vocab), create_empty_token=False,
                show_progress=False)
    built = time.perf_counter() - started
    model.save(str(bm25s_dir(work_dir, folder)))
    result = {"build_seconds": built, "peak_rss_bytes": peak_rss_bytes()}
    built_file.write_text(json.dumps(result))  # written last: a killed build is redone
    return result


def worker_bm25s(folder: Path, work_dir: Path, ks, repeats, min_seconds) -> dict:
    import bm25s
    from bm25s.tokenization import Tokenized

    toy = bm25s.BM25(method="lucene", backend="numba")
    toy.index(Tokenized(ids=[[0, 1], [1]], vocab={"a": 0, "b": 1}), create_empty_token=False, show_progress=False)
    toy.retrieve([[0]], k=1, n_threads=1, show_progress=False)  # compile its kernel before the baseline
    rss_before = rss_bytes_now()
    started = time.perf_counter()
    model = bm25s.BM25.load(str(bm25s_dir(work_dir, folder)), load_corpus=False)
    load = time.perf_counter() - started
    queries = read_queries(folder)
    vocab = model.vocab_dict
    empty = vocab[EMPTY_QUERY_TERM]

    def ids(terms):
        return [vocab[t] for t in terms if t in vocab] or [empty]

    query_ids = {"plain": [ids(t) for t in queries["plain"].values()],
                 "expanded": [ids(t + queries["expansion"][q]) for q, t in queries["plain"].items()]}
    num_docs = model.scores["num_docs"]
    timings = {}
    for kind in KINDS:
        qs = query_ids[kind]
        for k in ks:
            seconds, passes = best_time(lambda: model.retrieve(qs, k=min(k, num_docs), n_threads=1, show_progress=False),
                                        repeats, min_seconds)
            timings[f"{kind}_k{k}"] = {"qps": len(qs) / seconds, "passes": passes}
    docs, scores = model.retrieve(query_ids["plain"], k=AGREEMENT_K, n_threads=1, show_progress=False)
    rss_after = rss_bytes_now()
    return {"load_seconds": load, "timings": timings, "top": [(d.tolist(), s.tolist()) for d, s in zip(docs, scores)],
            "num_postings": len(model.scores["data"]),
            "index_bytes": sum(model.scores[key].nbytes for key in ("data", "indices", "indptr")),
            "rss_before_bytes": rss_before, "rss_after_queries_bytes": rss_after,
            "resident_index_bytes": rss_after - rss_before, "peak_rss_bytes": peak_rss_bytes()}


# ---------------------------------------------------------------------------------------------------------
# Parent: analysis, workers, report.
# ---------------------------------------------------------------------------------------------------------


def spawn(worker: str, folder: Path, work_dir: Path, num_shards: int, preset: str, ks, repeats, min_seconds) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--folder", str(folder),
           "--work-dir", str(work_dir), "--shards", str(num_shards), "--preset", preset, "--repeats", str(repeats),
           "--min-seconds", str(min_seconds), "--ks", *map(str, ks)]
    print(f"[{worker}] ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise RuntimeError(f"worker {worker} failed with exit code {proc.returncode}")
    print(f"[{worker}] {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(ours: list, theirs: list, k1: float) -> dict:
    """Top-10 of plain queries: same doc lists, and same scores rank by rank (bm25s's lucene scores lack the
    k1 + 1 factor; it pads with zero scores and breaks ties arbitrarily)."""
    same_ids = same_scores = 0
    for (our_docs, our_scores), (their_docs, their_scores) in zip(ours, theirs):
        kept = [(d, s * (k1 + 1.0)) for d, s in zip(their_docs, their_scores) if s > 0]
        same_ids += our_docs == [d for d, _ in kept]
        same_scores += len(kept) == len(our_scores) and bool(
            np.allclose(our_scores, [s for _, s in kept], rtol=SCORE_RTOL, atol=0))
    return {"identical": same_ids / len(ours), "identical_up_to_ties": same_scores / len(ours)}


def measure_searcher(num_docs: int, seed: int = SEED, preset: str = "sira", num_shards: int = 4, ks=KS,
                     repeats: int = 3, min_seconds: float = 1.0, work_dir: Path | None = None) -> dict:
    """Our searcher against bm25s-numba on `num_docs` synthetic documents: the report (see module docstring)."""
    from sira.core.presets import get_preset

    work_dir = Path(work_dir or Path.home() / ".cache" / "sira" / "bench")
    folder = corpus_folder(work_dir, num_docs, seed, preset)
    started = time.perf_counter()
    machine = machine_info()  # its load average now, before the runs
    analyse_corpus(folder, num_docs, seed, preset)
    meta = json.loads((folder / "complete.json").read_text())
    args = (folder, work_dir, num_shards, preset, ks, repeats, min_seconds)
    runs = {w: spawn(w, *args) for w in WORKERS}
    ours, theirs = runs["sira"], runs["bm25s-numba"]
    k1 = get_preset(preset).bm25.k1
    speed = {}
    for key, t in ours["timings"].items():
        base = theirs["timings"].get(key.replace("_with_doc_ids", ""))
        speed[key] = {"sira_qps": t["qps"], "bm25s_numba_qps": base["qps"], "ratio_vs_bm25s_numba": t["qps"] / base["qps"],
                      **({"sira_pruned_qps": t["pruned_qps"], "sira_exhaustive_qps": t["exhaustive_qps"],
                          "pruning_speedup": t["pruning_speedup"]} if "pruning_speedup" in t else {})}
    per_posting = {"sira": ours["resident_index_bytes"] / ours["num_postings"],
                   "bm25s_numba": theirs["resident_index_bytes"] / theirs["num_postings"]}
    return {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {"num_docs": num_docs, "seed": seed, "preset": preset, "shards": num_shards, "ks": list(ks),
                     "repeats": repeats, "min_seconds_per_repetition": min_seconds, "queries": "beir:scifact test",
                     "expansion": {"feedback_docs": FEEDBACK_DOCS, "terms": list(EXPANSION_TERMS), "tau": TAU,
                                   "weight": EXPANSION_WEIGHT}},
        "corpus": {"num_docs": meta["num_docs"], "analysis_seconds": meta["analysis_seconds"],
                   "vocabulary": runs["sira-build"]["vocabulary"], "postings": ours["num_postings"],
                   "avgdl": runs["sira-build"]["avgdl"], "query_terms": ours["query_terms"]},
        "speed": speed,
        "pruned_equals_exhaustive": ours["pruned_equals_exhaustive"],
        "agreement_top10_plain": agreement(ours["top"], theirs["top"], k1),
        "memory": {
            "resident_bytes_per_posting": per_posting,
            "index_bytes_per_posting": {"sira": ours["index_bytes"] / ours["num_postings"],
                                        "bm25s_numba": theirs["index_bytes"] / theirs["num_postings"]},
            "resident_index_mb": {"sira": ours["resident_index_bytes"] / 2**20,
                                  "bm25s_numba": theirs["resident_index_bytes"] / 2**20},
            "sira_rss_after_load_mb": (ours["rss_after_load_bytes"] - ours["rss_before_bytes"]) / 2**20,
            "sira_rss_after_queries_mb": (ours["rss_after_queries_bytes"] - ours["rss_before_bytes"]) / 2**20,
            "peak_rss_mb": {w: r["peak_rss_bytes"] / 2**20 for w, r in runs.items()},
        },
        "load_seconds": {"sira_cold_from_arrays": runs["sira-build"]["load_cold_seconds"],
                         "sira_warm_mmap": ours["load_warm_seconds"], "bm25s_load": theirs["load_seconds"]},
        "build_seconds": {"sira_from_arrays": runs["sira-build"]["build_from_arrays_seconds"],
                          "sira_cache_write": runs["sira-build"]["cache_write_seconds"],
                          "bm25s": runs["bm25s-build"]["build_seconds"]},
        "query_ratio_vs_bm25s_numba": min(speed[f"{kind}_k10"]["ratio_vs_bm25s_numba"] for kind in KINDS),
        "k1000_ratio_vs_bm25s_numba": min(speed[f"{kind}_k1000"]["ratio_vs_bm25s_numba"] for kind in KINDS),
        "memory_ratio_vs_bm25s": per_posting["bm25s_numba"] / per_posting["sira"],
        "wall_seconds": time.perf_counter() - started,
        "machine": {**machine, "load_average_at_end": os.getloadavg()},
    }


def print_summary(report: dict) -> None:
    print(f"{report['settings']['num_docs']:,} docs, {report['corpus']['postings']:,} postings, "
          f"{report['settings']['shards']} shards")
    print(f"{'query':<28}{'ours q/s':>10}{'bm25s q/s':>11}{'ratio':>7}{'pruned q/s':>12}{'exhaustive q/s':>16}"
          f"{'pruning x':>11}")
    for key, row in report["speed"].items():
        print(f"{key:<28}{row['sira_qps']:>10,.0f}{row['bm25s_numba_qps']:>11,.0f}{row['ratio_vs_bm25s_numba']:>7.2f}"
              + (f"{row['sira_pruned_qps']:>12,.0f}{row['sira_exhaustive_qps']:>16,.0f}{row['pruning_speedup']:>11.2f}"
                 if "pruning_speedup" in row else ""))
    mem = report["memory"]
    print(f"resident bytes/posting: ours {mem['resident_bytes_per_posting']['sira']:.2f}, "
          f"bm25s {mem['resident_bytes_per_posting']['bm25s_numba']:.2f}; arrays only: ours "
          f"{mem['index_bytes_per_posting']['sira']:.2f}, bm25s {mem['index_bytes_per_posting']['bm25s_numba']:.2f}")
    print(f"load: {report['load_seconds']}")
    print(f"pruned == exhaustive: {report['pruned_equals_exhaustive']}")
    print(f"agreement top-10 plain: {report['agreement_top10_plain']}")
    print(f"targets: query {report['query_ratio_vs_bm25s_numba']:.2f} (>= 2), k1000 "
          f"{report['k1000_ratio_vs_bm25s_numba']:.2f} (>= 1), memory {report['memory_ratio_vs_bm25s']:.2f} (>= 1)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=200_000, help="synthetic documents")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--preset", default="sira")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--ks", nargs="+", type=int, default=list(KS))
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best one counts")
    p.add_argument("--min-seconds", type=float, default=1.0, help="minimum duration of one repetition")
    p.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "sira" / "bench",
                   help="analysed corpora, shard cache and bm25s index (kept between runs)")
    p.add_argument("--output-json", type=Path)
    p.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)  # internal: one step in a subprocess
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        step = {
            "sira-build": lambda: worker_sira_build(args.folder, args.work_dir, args.shards, args.preset),
            "bm25s-build": lambda: worker_bm25s_build(args.folder, args.work_dir, args.preset),
            "sira": lambda: worker_sira(args.folder, args.work_dir, args.shards, args.preset, args.ks, args.repeats,
                                        args.min_seconds),
            "bm25s-numba": lambda: worker_bm25s(args.folder, args.work_dir, args.ks, args.repeats, args.min_seconds),
        }[args.worker]
        print(json.dumps(step()))
        return
    report = measure_searcher(args.docs, args.seed, args.preset, args.shards, args.ks, args.repeats, args.min_seconds,
                              args.work_dir)
    print_summary(report)
    output = args.output_json or REPO_ROOT / f"bench/results/searcher_scale_{args.docs}.json"
    write_json(report, output)
    print(f"wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
