"""Query speed of the SIRA searcher against bm25s, on the same corpus, the same analysed terms, one thread.

    python bench/query_speed.py [--datasets scifact nfcorpus arguana] [--preset pyserini-flat]
                                [--output-json bench/results/query_speed.json]

For each dataset the parent process starts one worker subprocess per engine (so each peak RSS is that
engine's own). A worker analyses the corpus with our Analyzer, builds its index in-process (no Spark),
times the query loop for every k (best of --repeats) and prints one JSON line; the parent checks that
ours and bm25s-numba rank alike, prints tables and writes the JSON report.
"""

from __future__ import annotations

import os

# Single thread everywhere; these must be set before numpy / numba are first imported.
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("DISABLE_TQDM", "1")  # bm25s progress bars

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

DEFAULT_DATASETS = ("scifact", "nfcorpus", "arguana")
ENGINES = ("sira", "bm25s-numpy", "bm25s-numba")
SHORT_NAMES = {"sira": "ours", "bm25s-numpy": "numpy", "bm25s-numba": "numba"}
KS = (10, 1000)
AGREEMENT_K = 10
SCORE_RTOL = 1e-5  # float32 sums in a different order differ by a few ulps
EMPTY_QUERY_TERM = "\x00empty"  # our analyzers emit only alphanumerics (and ""), never a NUL


# ---------------------------------------------------------------------------------------------------------
# Worker side: corpus -> analysed terms -> one engine's index -> timed query loops.
# ---------------------------------------------------------------------------------------------------------


def load_corpus(dataset) -> tuple[list[str], list[str]]:
    """(doc_ids, texts) in doc-id order, validated and de-duplicated the way `sira ingest` does it."""
    from sira.core.datasets import RawRecord, RecordError, iter_lines, parse_record

    docs: dict[str, str] = {}
    for n, line in iter_lines(dataset.corpus_path):
        try:
            doc_id, title, text = parse_record(RawRecord(str(dataset.corpus_path), n, line))
        except RecordError:
            continue
        # Same field joining as the index build (sira.pipelines.index.workers); the first record of a duplicated id wins.
        docs.setdefault(doc_id, f"{title} {text}" if title else text)
    doc_ids = sorted(docs)  # shard doc ordinals follow doc-id order
    return doc_ids, [docs[d] for d in doc_ids]


def build_sira_searcher(doc_ids: list[str], docs_terms: list[list[str]], analyzer, k1: float, b: float):
    """One ShardIndex over the whole corpus, built like the Spark job: postings sorted by term id."""
    import numpy as np

    from sira.core.bm25 import CorpusStats, ShardIndex
    from sira.core.hashing import term_id
    from sira.core.search import Searcher

    vocab: dict[str, int] = {}
    post_term, post_ord, post_tf = [], [], []
    doc_lens = np.empty(len(docs_terms), dtype=np.int32)
    for ord_, terms in enumerate(docs_terms):
        doc_lens[ord_] = len(terms)
        for term, tf in Counter(terms).items():
            post_term.append(vocab.setdefault(term, len(vocab)))
            post_ord.append(ord_)
            post_tf.append(tf)
    vocab_ids = np.fromiter((term_id(t) for t in vocab), dtype=np.int64, count=len(vocab))
    if len(np.unique(vocab_ids)) != len(vocab_ids):
        raise RuntimeError("term id hash collision in this corpus")
    tids = vocab_ids[np.asarray(post_term, dtype=np.int64)]
    order = np.lexsort((np.asarray(post_ord), tids))  # by term id, then doc ordinal
    tids = tids[order]
    uniq_tids, starts, dfs = np.unique(tids, return_index=True, return_counts=True)
    stats = CorpusStats(len(doc_ids), float(doc_lens.sum()) / len(doc_ids), k1, b)
    shard = ShardIndex.from_postings(
        shard=0,
        doc_ids=np.asarray(doc_ids, dtype=object),
        doc_lens=doc_lens,
        term_ids=uniq_tids,
        dfs=dfs,
        postings_offsets=np.append(starts, len(tids)),
        postings_ords=np.asarray(post_ord, dtype=np.int32)[order],
        postings_tfs=np.asarray(post_tf, dtype=np.int32)[order],
        stats=stats,
    )
    return Searcher([shard], stats, analyzer)


def sira_index_nbytes(shard) -> int:
    return sum(a.nbytes for a in (shard.doc_lens, shard.term_ids, shard.indptr, shard.doc_ords, shard.impacts,
                                  shard.term_max))


def build_bm25s(docs_terms: list[list[str]], k1: float, b: float, backend: str):
    """bm25s over the same terms, plus an EMPTY_QUERY_TERM column that no document contains, so that a query
    without known terms scores nothing. (bm25s's own "" column is appended *after* the matrix is built, so
    its numba path would read past indptr; and "" can be a real term: Porter stems "s" to "".)"""
    import bm25s
    from bm25s.tokenization import Tokenized

    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in terms] for terms in docs_terms]
    vocab[EMPTY_QUERY_TERM] = len(vocab)
    model = bm25s.BM25(method="lucene", k1=k1, b=b, backend=backend)
    # create_empty_token=False: no "" entry pointing past the matrix; empty queries are mapped above instead.
    model.index(Tokenized(ids=ids, vocab=vocab), create_empty_token=False, show_progress=False)
    return model


def bm25s_query_ids(model, queries_terms: list[list[str]]) -> list[list[int]]:
    """Vocab ids with repetition, OOV terms dropped; an empty query becomes the EMPTY_QUERY_TERM column
    (scores all 0), because retrieve() rejects an empty first query (bm25s itself would substitute "")."""
    empty = model.vocab_dict[EMPTY_QUERY_TERM]
    out = []
    for terms in queries_terms:
        ids = [model.vocab_dict[t] for t in terms if t in model.vocab_dict]
        out.append(ids or [empty])
    return out


def bm25s_index_nbytes(model) -> int:
    return sum(model.scores[key].nbytes for key in ("data", "indices", "indptr"))


def best_time(run_once: Callable[[], object], repeats: int, min_seconds: float) -> tuple[float, int]:
    """Best seconds per pass over the query set, and passes per repetition.

    Two untimed passes first (numba JIT, caches); a repetition loops enough passes to last >= min_seconds,
    since one pass over a few hundred queries takes only milliseconds."""
    run_once()
    start = time.perf_counter()
    run_once()
    one_pass = max(time.perf_counter() - start, 1e-6)
    passes = max(1, math.ceil(min_seconds / one_pass))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(passes):
            run_once()
        best = min(best, (time.perf_counter() - start) / passes)
    return best, passes


def run_each(fn: Callable, items: list) -> None:
    """Run fn over every item, dropping results as a serving loop would (holding 1000 Hit objects for
    each of 1406 queries would add ~400 MB to the peak RSS)."""
    for item in items:
        fn(item)


def rss_bytes_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def time_sira(searcher, queries_terms, query_texts, ks, repeats, min_seconds) -> tuple[dict, list]:
    from sira.core.search import QueryPart, compile_query

    shard = searcher.shards[0]
    compiled = [compile_query([QueryPart(tuple(t))]) for t in queries_terms]  # analysis/hashing not timed
    timings = {}
    for k in ks:
        # Like bm25s-numba's retrieve: the whole query batch in one compiled call.
        seconds, passes = best_time(lambda: shard.top_k_many(compiled, k), repeats, min_seconds)
        e2e_seconds, e2e_passes = best_time(lambda: searcher.rank_many(query_texts, k), repeats, min_seconds)
        timings[f"k{k}"] = {
            "seconds_per_pass": seconds, "passes": passes, "qps": len(compiled) / seconds,
            "e2e_seconds_per_pass": e2e_seconds, "e2e_passes": e2e_passes, "e2e_qps": len(compiled) / e2e_seconds,
        }
    top = [shard.top_k(q, AGREEMENT_K) for q in compiled]
    return timings, [(ords.tolist(), scores.tolist()) for ords, scores in top]


def time_bm25s(model, queries_terms, backend, ks, repeats, min_seconds) -> tuple[dict, list]:
    query_ids = bm25s_query_ids(model, queries_terms)  # vocab lookup not timed, like compile_query for ours
    num_docs = model.scores["num_docs"]
    # numba: one njit call for the whole batch, serial. numpy: a plain map over queries (n_threads=0).
    n_threads = 1 if backend == "numba" else 0

    def retrieve(k):
        return model.retrieve(query_ids, k=min(k, num_docs), n_threads=n_threads, backend_selection=backend,
                              show_progress=False)

    timings = {}
    for k in ks:
        seconds, passes = best_time(lambda: retrieve(k), repeats, min_seconds)
        timings[f"k{k}"] = {"seconds_per_pass": seconds, "passes": passes, "qps": len(query_ids) / seconds}
    docs, scores = retrieve(AGREEMENT_K)
    return timings, [(d.tolist(), s.tolist()) for d, s in zip(docs, scores)]


def run_worker(engine: str, dataset_name: str, preset_name: str, split: str, ks, repeats, min_seconds) -> dict:
    from sira.core.analysis import Analyzer
    from sira.core.datasets import resolve_dataset
    from sira.core.presets import get_preset

    preset = get_preset(preset_name)
    analyzer = Analyzer(preset.analyzer)
    dataset = resolve_dataset(f"beir:{dataset_name}")
    doc_ids, texts = load_corpus(dataset)
    docs_terms = [analyzer.terms(t) for t in texts]
    del texts
    queries = dataset.queries(split)
    query_texts = list(queries.values())
    queries_terms = [analyzer.terms(t) for t in query_texts]
    import bm25s  # noqa: F401  (both engines' libraries are loaded before the baseline, for every engine)
    import sira.core.search  # noqa: F401

    rss_before_index = rss_bytes_now()

    k1, b = preset.bm25.k1, preset.bm25.b
    start = time.perf_counter()
    if engine == "sira":
        searcher = build_sira_searcher(doc_ids, docs_terms, analyzer, k1, b)
        build_seconds = time.perf_counter() - start
        peak_rss_after_build = peak_rss_bytes()
        index_nbytes = sira_index_nbytes(searcher.shards[0])
        timings, top = time_sira(searcher, queries_terms, query_texts, ks, repeats, min_seconds)
    else:
        backend = engine.split("-", 1)[1]
        model = build_bm25s(docs_terms, k1, b, backend)
        build_seconds = time.perf_counter() - start
        peak_rss_after_build = peak_rss_bytes()
        index_nbytes = bm25s_index_nbytes(model)
        timings, top = time_bm25s(model, queries_terms, backend, ks, repeats, min_seconds)
    rss_after_queries = rss_bytes_now()
    return {
        "engine": engine,
        "dataset": dataset_name,
        "num_docs": len(doc_ids),
        "num_queries": len(query_texts),
        "queries_with_repeated_terms": sum(len(set(t)) < len(t) for t in queries_terms),
        "queries_without_terms": sum(not t for t in queries_terms),
        "build_seconds": build_seconds,
        "index_nbytes": index_nbytes,
        "rss_before_index_bytes": rss_before_index,
        "peak_rss_after_build_bytes": peak_rss_after_build,
        "rss_after_queries_bytes": rss_after_queries,
        "peak_rss_bytes": peak_rss_bytes(),
        "timings": timings,
        "top": top,  # per query: (doc ordinals, scores) of the AGREEMENT_K best, for the parent's check
    }


# ---------------------------------------------------------------------------------------------------------
# Parent side: one subprocess per (dataset, engine), agreement, report.
# ---------------------------------------------------------------------------------------------------------


def spawn_worker(engine: str, dataset: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine, "--dataset", dataset,
           "--preset", args.preset, "--split", args.split, "--repeats", str(args.repeats),
           "--min-seconds", str(args.min_seconds), "--ks", *map(str, args.ks)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise RuntimeError(f"worker {engine}/{dataset} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(ours_top: list, theirs_top: list, k1: float) -> dict:
    """Fraction of queries with the same top-k doc list, and with the same scores rank by rank.

    bm25s's lucene variant omits the (k1 + 1) factor, so its scores are rescaled. It also pads with
    zero-score docs and breaks ties arbitrarily; zero scores are dropped, and "same scores" (within
    SCORE_RTOL) means any difference in the lists is a tie, not a ranking difference."""
    same_ids = same_scores = 0
    for (our_ords, our_scores), (their_ords, their_scores) in zip(ours_top, theirs_top):
        kept = [(d, s * (k1 + 1.0)) for d, s in zip(their_ords, their_scores) if s > 0]
        same_ids += our_ords == [d for d, _ in kept]
        same_scores += len(kept) == len(our_scores) and all(
            math.isclose(a, s, rel_tol=SCORE_RTOL) for a, (_, s) in zip(our_scores, kept))
    n = len(ours_top)
    return {"identical": same_ids / n, "identical_up_to_ties": same_scores / n}


def summarize_dataset(results: dict[str, dict], ks, k1: float) -> dict:
    ours = results["sira"]
    summary = {
        "num_docs": ours["num_docs"],
        "num_queries": ours["num_queries"],
        "queries_with_repeated_terms": ours["queries_with_repeated_terms"],
        "queries_without_terms": ours["queries_without_terms"],
    }
    for k in ks:
        key = f"k{k}"
        row = {
            "sira_top_k_qps": ours["timings"][key]["qps"],
            "sira_search_e2e_qps": ours["timings"][key]["e2e_qps"],
            "bm25s_numpy_qps": results["bm25s-numpy"]["timings"][key]["qps"],
            "bm25s_numba_qps": results["bm25s-numba"]["timings"][key]["qps"],
            "passes_per_repetition": {e: r["timings"][key]["passes"] for e, r in results.items()},
        }
        row["ratio_vs_bm25s_numpy"] = row["sira_top_k_qps"] / row["bm25s_numpy_qps"]
        row["ratio_vs_bm25s_numba"] = row["sira_top_k_qps"] / row["bm25s_numba_qps"]
        summary[key] = row
    agree = agreement(ours["top"], results["bm25s-numba"]["top"], k1)
    summary["agreement_top10"] = agree["identical"]
    summary["agreement_top10_up_to_ties"] = agree["identical_up_to_ties"]
    mb = 1 / 2**20
    summary["peak_rss_mb"] = {e: r["peak_rss_bytes"] * mb for e, r in results.items()}
    summary["rss_before_index_mb"] = {e: r["rss_before_index_bytes"] * mb for e, r in results.items()}
    summary["peak_rss_after_build_mb"] = {e: r["peak_rss_after_build_bytes"] * mb for e, r in results.items()}
    summary["rss_after_queries_mb"] = {e: r["rss_after_queries_bytes"] * mb for e, r in results.items()}
    summary["index_bytes"] = {e: r["index_nbytes"] for e, r in results.items()}
    summary["build_seconds"] = {e: r["build_seconds"] for e, r in results.items()}
    return summary


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info() -> dict:
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_average_at_start": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{name: metadata.version(name) for name in ("numpy", "numba", "bm25s", "scipy")},
    }


def print_tables(report: dict, ks) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = Table = None
    speed_cols = ["dataset", "k", "ours top_k q/s", "ours rank_many() q/s", "bm25s numpy q/s", "bm25s numba q/s",
                  "ours/numpy", "ours/numba"]
    speed_rows = []
    for name, d in report["datasets"].items():
        for k in ks:
            r = d[f"k{k}"]
            speed_rows.append([name, str(k), f"{r['sira_top_k_qps']:,.0f}", f"{r['sira_search_e2e_qps']:,.0f}",
                               f"{r['bm25s_numpy_qps']:,.0f}", f"{r['bm25s_numba_qps']:,.0f}",
                               f"{r['ratio_vs_bm25s_numpy']:.2f}", f"{r['ratio_vs_bm25s_numba']:.2f}"])
    mem_cols = ["dataset", "docs", "queries", "top10 same", "same up to ties", "RSS before index MB",
                *(f"peak RSS MB {SHORT_NAMES[e]}" for e in ENGINES), "index MB ours", "index MB bm25s",
                *(f"build s {SHORT_NAMES[e]}" for e in ENGINES)]
    mem_rows = []
    for name, d in report["datasets"].items():
        rss, idx, bld = d["peak_rss_mb"], d["index_bytes"], d["build_seconds"]
        mem_rows.append([name, str(d["num_docs"]), str(d["num_queries"]), f"{d['agreement_top10']:.3f}",
                         f"{d['agreement_top10_up_to_ties']:.3f}", f"{d['rss_before_index_mb']['sira']:.0f}",
                         *(f"{rss[e]:.0f}" for e in ENGINES), f"{idx['sira'] / 2**20:.1f}",
                         f"{idx['bm25s-numba'] / 2**20:.1f}", *(f"{bld[e]:.2f}" for e in ENGINES)])
    for title, cols, rows in (("Query speed (single thread)", speed_cols, speed_rows),
                              ("Memory, build, agreement", mem_cols, mem_rows)):
        if Table is None:
            print(title)
            for row in [cols, *rows]:
                print(" | ".join(row))
            continue
        table = Table(title=title)
        for c in cols:
            table.add_column(c, justify="left" if c == "dataset" else "right")
        for row in rows:
            table.add_row(*row)
        # Off a terminal rich wraps at 80 columns; a report file or CI log reads better unwrapped.
        Console(width=None if sys.stdout.isatty() else 180).print(table)
    print(f"smallest ours/bm25s ratio: vs numba {report['ratio_vs_bm25s_numba']:.2f}, "
          f"vs numpy {report['ratio_vs_bm25s_numpy']:.2f}")


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # a killed run never leaves half a report
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def run_benchmark(args) -> dict:
    from sira.core.presets import get_preset

    preset = get_preset(args.preset)
    report = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            "preset": args.preset, "k1": preset.bm25.k1, "b": preset.bm25.b, "split": args.split,
            "ks": list(args.ks), "repeats": args.repeats, "min_seconds_per_repetition": args.min_seconds,
            "timing": "best of `repeats` repetitions; a repetition loops the whole query set `passes` times",
            "sira": "ShardIndex.top_k_many over pre-compiled WeightedQuery batch (no analysis); e2e = Searcher.rank_many(texts)",
            "bm25s": "BM25(method='lucene').retrieve(list of vocab-id lists) in one call; numba n_threads=1",
            "query_term_frequency": "both engines count a repeated query term once per occurrence",
            "arguana": "no self-exclusion of the query's own doc id (sira eval does exclude it)",
        },
        "datasets": {},
        "machine": machine_info(),
    }
    for name in args.datasets:
        results = {}
        for engine in ENGINES:
            print(f"[{name}] {engine} ...", file=sys.stderr, flush=True)
            results[engine] = spawn_worker(engine, name, args)
        report["datasets"][name] = summarize_dataset(results, args.ks, preset.bm25.k1)
    rows = [d[f"k{k}"] for d in report["datasets"].values() for k in args.ks]
    report["ratio_vs_bm25s_numba"] = min(r["ratio_vs_bm25s_numba"] for r in rows)
    report["ratio_vs_bm25s_numpy"] = min(r["ratio_vs_bm25s_numpy"] for r in rows)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    return report


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=list(DEFAULT_DATASETS), help="BEIR dataset names")
    p.add_argument("--preset", default="pyserini-flat", help="analysis + BM25 preset (sira | pyserini-flat)")
    p.add_argument("--split", default="test", help="query split (queries judged in qrels/<split>.tsv)")
    p.add_argument("--ks", nargs="+", type=int, default=list(KS), help="depths to time")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions; the best one counts")
    p.add_argument("--min-seconds", type=float, default=0.5, help="minimum duration of one repetition")
    p.add_argument("--output-json", type=Path, default=REPO_ROOT / "bench/results/query_speed.json")
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)  # internal: one engine, one dataset
    p.add_argument("--dataset", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        result = run_worker(args.worker, args.dataset, args.preset, args.split, args.ks, args.repeats,
                            args.min_seconds)
        print(json.dumps(result))
        return
    report = run_benchmark(args)
    print_tables(report, args.ks)
    write_json(report, args.output_json)
    print(f"wrote {args.output_json}", file=sys.stderr)


if __name__ == "__main__":
    main()
