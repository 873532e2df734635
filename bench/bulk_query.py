"""Offline bulk scoring end to end: `sira query` over a large query file against bm25s on the same analysed terms.

    python bench/bulk_query.py --docs 1000000 --queries 100000 --output-json bench/results/bulk_query_1m.json

What it measures, on the synthetic corpus of bench/scale.py (bench/synthetic_corpus.py, `--seed`):
- The warehouse: `sira ingest` and `sira index --no-enrichment` (the sira preset, default shards), built once per
  work dir and reused.
- The queries (`make_queries`): Q lines of queries.jsonl drawn with a seeded generator from a pool of the bundled
  collections' queries (scifact, nfcorpus, arguana; every split) and their corpus sentences, keeping those of 3 to 20
  words; a drawn entry is used whole. The same file for every engine.
- `sira query` end to end (the process started, the query file read, results in the runs table, the TREC and Parquet
  runs written) at each k, plain (`--no-expand`) and expanded (`--backend openai` against bench/instant_openai.py,
  so the pipeline and not a model is measured; the expansions cache is emptied first, so each expanded run pays
  for its expansions). Queries per second = Q / seconds, and the job's own split (expansion, scoring, commits,
  outputs). The peak resident memory of its whole process tree (driver, Ray workers and shard actors).
- bm25s (`retrieve(..., n_threads=2)`, numba backend) the way its users run it: a saved index of the same analysed
  corpus (bench/searcher_scale.py builds it) loaded, the same query file read and analysed by the same Analyzer
  (expanded: the same proposed phrases' analysed terms appended, unweighted), the same TREC format written (doc ids
  from its row numbers). Its numba compile and its list of doc ids are made before the clock starts.
- One worker: the plain k=100 run again with `--workers 1` (the default is one query worker per CPU):
  `scaling_2_vs_1` = its scoring seconds / the default run's.
- One searcher: a process that opens the index in process (`open_retriever`, the shard cache memory-mapped) and
  scores the first 1,000 queries. `memory_vs_one_searcher`: the query workers' peak proportional set size (PSS,
  summed at one instant: a shard page mapped by every worker counts once, which is what "one copy between them"
  means) during the plain k=100 run / the searcher's PSS at its end; `tree_rss_vs_one_searcher`: the run's whole
  process tree (driver, Ray's own processes, workers), resident bytes summed (a shared page once per process) /
  the searcher's resident bytes.
- Commit cost: `commit_last_vs_first_tenth`, per run, the mean seconds of a runs-table append in the run's last
  tenth of commits over its first tenth's (1.0: flat; `commit_cost` in each run's summary).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import instant_openai  # noqa: E402
from bench.scale import run_job  # noqa: E402

KINDS = ("plain", "expanded")
MIN_WORDS, MAX_WORDS = 3, 20


def make_queries(path: Path, count: int, seed: int) -> Path:
    """`count` queries.jsonl lines drawn (seeded) from the bundled collections' queries and corpus sentences."""
    if path.exists():
        return path
    from bench.synthetic_corpus import SOURCES, source_pool
    from sira.core.datasets import resolve_dataset

    pool = [s for s in source_pool().sentences if MIN_WORDS <= len(s.split()) <= MAX_WORDS]
    for name in SOURCES:
        dataset = resolve_dataset(f"beir:{name}")
        for split in ("train", "dev", "test"):
            try:
                pool += [q for q in dataset.queries(split).values() if MIN_WORDS <= len(q.split()) <= MAX_WORDS]
            except (FileNotFoundError, ValueError, LookupError):
                continue
    rng = random.Random(seed)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as out:
        for i in range(count):
            out.write(json.dumps({"_id": f"b{i:07d}", "text": rng.choice(pool)}) + "\n")
    tmp.replace(path)
    return path


def build_warehouse(work: Path, docs: int, seed: int, logs: Path) -> tuple[Path, dict]:
    from bench.synthetic_corpus import iter_documents, write_parquet

    corpus = work / f"corpus-{docs}-s{seed}.parquet"
    if not corpus.exists():
        write_parquet(corpus, iter_documents(docs, seed))
    wh, done = work / f"wh-{docs}", work / f"wh-{docs}.built.json"
    if done.exists():
        return wh, json.loads(done.read_text())
    shutil.rmtree(wh, ignore_errors=True)
    built = {"ingest": run_job(["ingest", str(corpus), "-w", str(wh)], logs / "ingest.log"),
             "index": run_job(["index", "-w", str(wh), "--no-enrichment"], logs / "index.log")}
    done.write_text(json.dumps(built))
    return wh, built


def sira_query(wh: Path, queries: Path, k: int, kind: str, base_url: str, work: Path, logs: Path,
               workers: int = 0) -> dict:
    name = f"{kind}-k{k}{f'-w{workers}' if workers else ''}"
    shutil.rmtree(wh / "expansions", ignore_errors=True)
    shutil.rmtree(wh / "runs", ignore_errors=True)  # every run starts from an empty runs table
    out, summary = work / f"run-{name}.trec", work / f"run-{name}.json"
    args = ["query", "-w", str(wh), "--queries", str(queries), "--out", str(out), "--run-id", name, "-k", str(k),
            "--output-json", str(summary)]
    args += ["--no-expand"] if kind == "plain" else ["--backend", "openai", "--model", "instant", "--base-url",
                                                     base_url]
    job = run_job(args + (["--workers", str(workers)] if workers else []), logs / f"{name}.log")
    return {**job, "summary": json.loads(summary.read_text()), "run_file": str(out)}


def searcher_worker(wh: str, queries: str) -> None:
    """One searcher in this process: open the index (the shard cache mapped) and score 1,000 queries."""
    from itertools import islice

    from bench.query_speed import rss_bytes_now
    from bench.scale import pss_bytes
    from sira.pipelines.serving.query_runs import iter_queries
    from sira.pipelines.serving.retrievers import open_retriever

    retriever, _ = open_retriever(wh, k=100)
    retriever({q.qid: q.text for q in islice(iter_queries(queries), 1000) if q.error is None})
    print(json.dumps({"rss_bytes": rss_bytes_now(), "pss_bytes": pss_bytes(os.getpid())}))


def bm25s_worker(folder: str, work: str, queries: str, k: int, kind: str, out: str) -> None:
    """bm25s end to end: load the saved index, read and analyse the queries, retrieve with 2 threads, write TREC."""
    # Not bench.query_speed or bench.searcher_scale: importing them pins numba to one thread (their benches are
    # single-threaded), and bm25s is run here as its users run it, on both cores.
    import bm25s
    from bm25s.tokenization import Tokenized

    from bench.synthetic_corpus import doc_id_of
    from sira.pipelines.serving.query_runs import iter_queries
    from sira.core.analysis import Analyzer
    from sira.core.presets import get_preset

    toy = bm25s.BM25(method="lucene", backend="numba")
    toy.index(Tokenized(ids=[[0, 1], [1]], vocab={"a": 0, "b": 1}), create_empty_token=False, show_progress=False)
    toy.retrieve([[0]], k=1, n_threads=2, show_progress=False)  # its compile, paid before the clock starts
    doc_ids = [doc_id_of(n) for n in range(json.loads((Path(folder) / "complete.json").read_text())["num_docs"])]
    started = time.perf_counter()
    model = bm25s.BM25.load(str(Path(work) / f"bm25s-{Path(folder).name}"), load_corpus=False)  # searcher_scale's
    analyzer, vocab = Analyzer(get_preset("sira").analyzer), model.vocab_dict
    extra = [t for phrase in instant_openai.KEYWORDS for t in analyzer.terms(phrase)] if kind == "expanded" else []
    qids, ids = [], []
    for q in iter_queries(queries):
        qids.append(q.qid)
        ids.append([vocab[t] for t in analyzer.terms(q.text) + extra if t in vocab] or [vocab["\x00empty"]])  # query_speed.EMPTY_QUERY_TERM
    docs, scores = model.retrieve(ids, k=k, n_threads=2, show_progress=False)
    with open(out, "w", encoding="utf-8") as fh:
        for qid, row, row_scores in zip(qids, docs, scores):
            fh.writelines(f"{qid} Q0 {doc_ids[d]} {r} {s:.6f} bm25s\n"
                          for r, (d, s) in enumerate(zip(row.tolist(), row_scores.tolist()), 1) if s > 0)
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    print(json.dumps({"seconds": time.perf_counter() - started, "rss_bytes": rss}))


def _worker(args: list[str], log: Path) -> dict:
    # Without the one-thread pins the single-threaded benches' modules leave in this process's environment.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    with open(log, "w") as err:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=REPO_ROOT, check=True,
                             stdout=subprocess.PIPE, stderr=err, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def bm25s_runs(args, work: Path, queries: Path, logs: Path, runs: bool = True) -> dict:
    from bench.searcher_scale import analyse_corpus, corpus_folder, worker_bm25s_build

    folder = corpus_folder(work, args.docs, args.seed, "sira")
    analyse_corpus(folder, args.docs, args.seed, "sira")
    build = worker_bm25s_build(folder, work, "sira")
    if not runs:
        return build
    runs = {}
    for k in args.k:
        for kind in KINDS:
            runs[f"{kind}-k{k}"] = _worker(["--bm25s", str(folder), str(work), str(queries), str(k), kind,
                                            str(work / f"bm25s-{kind}-k{k}.trec")], logs / f"bm25s-{kind}-k{k}.log")
    return {"build": build, "runs": runs}


def measure(args) -> dict:
    work, logs = args.work_dir, args.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    wh, built = build_warehouse(work, args.docs, args.seed, logs)
    queries = make_queries(work / f"queries-{args.queries}-s{args.seed}.jsonl", args.queries, args.seed)
    # The shard cache written once before any timed run (bm25s's saved index is built ahead too): otherwise the
    # first run pays for it (b7a3824's plain k=10 run at 1M, about 35 s of its 93).
    _worker(["--searcher", str(wh), str(queries)], logs / "shard-cache.log")
    if args.prepare_only:  # the corpus, warehouse, queries and bm25s's index, built ahead of a timed run
        return {"warehouse_build": built, "bm25s_build": None if args.skip_bm25s else bm25s_runs(args, work, queries,
                                                                                               logs, runs=False)}
    runs = {}
    with instant_openai.start(max_seconds=6 * 3600) as server:
        for k in args.k:
            for kind in KINDS:
                runs[f"{kind}-k{k}"] = sira_query(wh, queries, k, kind, server.base_url, work, logs)
                print(f"sira query {kind} k={k}: {runs[f'{kind}-k{k}']['seconds']} s", flush=True)
    one_worker = sira_query(wh, queries, 100, "plain", "", work, logs, workers=1)
    searcher = _worker(["--searcher", str(wh), str(queries)], logs / "searcher.log")
    bm25s = bm25s_runs(args, work, queries, logs) if not args.skip_bm25s else None
    qps = {k: {kind: round(args.queries / runs[f"{kind}-k{k}"]["seconds"], 1) for kind in KINDS} for k in args.k}
    ratios = {k: {kind: round(bm25s["runs"][f"{kind}-k{k}"]["seconds"] / runs[f"{kind}-k{k}"]["seconds"], 3)
                  for kind in KINDS} for k in args.k} if bm25s else None
    scoring = lambda run: run["summary"]["seconds_by_part"]["scoring"]  # noqa: E731
    return {
        "docs": args.docs, "queries": args.queries,
        "qps_end_to_end": qps,
        "ratio_vs_bm25s_threads2_k100": min(ratios[100].values()) if ratios and 100 in ratios else None,
        "ratio_vs_bm25s_threads2_k1000": min(ratios[1000].values()) if ratios and 1000 in ratios else None,
        "ratios_vs_bm25s_threads2": ratios,
        "scaling_2_vs_1": round(scoring(one_worker) / scoring(runs["plain-k100"]), 3) if "plain-k100" in runs else None,
        "memory_vs_one_searcher": round(runs["plain-k100"]["peak_rss_query_workers_pss_mb"] * 2**20
                                        / searcher["pss_bytes"], 3)
        if "peak_rss_query_workers_pss_mb" in runs.get("plain-k100", {}) else None,
        "tree_rss_vs_one_searcher": round(runs["plain-k100"]["peak_rss_tree_mb"] * 2**20 / searcher["rss_bytes"], 3)
        if "plain-k100" in runs else None,
        # The commits' cost over a run: the mean append of its last tenth of commits over its first tenth's.
        "commit_last_vs_first_tenth": {name: _commit_growth(run) for name, run in runs.items()},
        "runs": runs, "one_worker": one_worker, "searcher": searcher, "bm25s": bm25s, "warehouse_build": built,
        "command": "python bench/bulk_query.py " + " ".join(sys.argv[1:]),
        "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                     text=True).stdout.strip(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _commit_growth(run: dict) -> float | None:
    cost = run["summary"].get("commit_cost") or {}
    first, last = cost.get("first_tenth_s"), cost.get("last_tenth_s")
    return round(last / first, 3) if first and last is not None else None


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--searcher":
        return searcher_worker(*argv[1:])
    if argv and argv[0] == "--bm25s":
        folder, work, queries, k, kind, out = argv[1:]
        return bm25s_worker(folder, work, queries, int(k), kind, out)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100, 1000])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-bulk-query"))
    ap.add_argument("--skip-bm25s", action="store_true")
    ap.add_argument("--prepare-only", action="store_true", help="build what the timed runs read, then stop")
    ap.add_argument("--output-json", type=Path)
    args = ap.parse_args(argv)
    report = measure(args)
    text = json.dumps(report, indent=2) + "\n"
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
