"""The suite at scale, in one run: a full enriched build, default nights, the searcher's load and query speed.

    python bench/scale.py --docs 1000000 [--nights 3] [--changed-fraction 0.01] [--seed 7]
                          [--work-dir /tmp/sira-scale] [--skip-bm25s] [--skip-searcher] [--skip-enrich]
                          --output-json bench/results/scale_1m.json

Everything runs through the real jobs with their default settings (the `sira` CLI in a subprocess of its own,
local Spark and Ray, Delta tables on local disk), on a synthetic corpus (bench/synthetic_corpus.py: resampled
BEIR sentences, natural lengths, a growing vocabulary), with enrichment against bench/instant_openai.py (an
OpenAI-compatible loopback server that answers at once: the pipeline is measured, not a model). Each job is
timed and its process tree sampled for memory every 0.2 s, per group: the job's Python process (driver), the
Spark JVM, the Python workers (Spark's and Ray's).

1. Full enriched build: `sira nightly --source corpus.parquet --backend openai ...` on an empty warehouse (ingest,
   enrich, index (enriched), retention; bench/nights.full_build): seconds (the nights' denominator), per step,
   bytes on disk per table.
2. `--nights` default nights (3): night i applies a fresh change set of `--changed-fraction` to the previous
   snapshot (bench/nights.write_next_snapshot: 60% updated, 20% deleted, 20% inserted, seed + i - 1), then
   `sira nightly` with the same backend: seconds, per step, fraction of the full build, peaks per group.
3. Loading the newest `sira` index from Delta with no shard cache (bench/scale.py's load worker, a subprocess).
4. Query speed on that index (query_speed_worker, a subprocess mapping the cache the load wrote): the 300 scifact
   test queries plain and expanded (pseudo-relevance feedback terms, feedback_expansions) at k 10 and 1000, and
   its bytes per posting, resident and arrays alone.
5. Unless `--skip-bm25s` (bm25s does not fit at 5M): `sira index --preset pyserini-flat --no-enrichment --full` on
   the same warehouse, and bm25s (0.3.16; its own tokenizer with PyStemmer's English stemmer and its English
   stopwords, unigrams, as `bm25s.tokenize` + `BM25.index`) on the same documents, one thread: docs/s. Its ratio
   is ours per core over bm25s's (one core).
6. Unless `--skip-searcher`: the searcher against bm25s on the same corpus and analysed terms
   (bench/searcher_scale.measure_searcher; it holds the analysed corpus in memory: 1M at most here).
7. Unless `--skip-enrich`: the enrichment pipeline's own cost, `sira enrich --backend openai` against the instant
   server (bench/enrich_overhead.measure_enrich_overhead), at min(--docs, --enrich-docs) documents.

The JSON's top level holds the issue's figures (ratios > 1: ours is better; `peak_rss_mb` the highest peak of each
process group over the build and the nights, and the searcher's load); `nights` and `steps` hold the details.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.synthetic_corpus import iter_documents, write_parquet  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- process-tree memory --------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def _rss_and_role(pid: int, root: int) -> tuple[int, int, str] | None:
    """Resident bytes, of which anonymous (resident minus file-backed and shared: what the process itself
    allocated, heap and off-heap buffers; not the memory-mapped files the page cache can drop), and the role."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            fields = fh.read().split()
            rss, shared = int(fields[1]) * PAGE, int(fields[2]) * PAGE
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None
    role = "driver" if pid == root else "jvm" if cmd.endswith("java") else "query_workers" if \
        cmd.startswith("ray::QueryWorker") else "python_workers" if "python" in cmd else "other"
    return rss, rss - shared, role


def pss_bytes(pid: int) -> int:
    """Proportional set size: resident bytes with each shared page split among the processes that map it, so that
    summing it over processes counts a page cache page (a memory-mapped shard) once, not once per process."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


class TreeMemory(threading.Thread):
    """Peak resident bytes of a process tree by role (each role's processes summed at one instant) and in all."""

    def __init__(self, root: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.interval, self.peaks = root, interval, {}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            now: dict[str, int] = {}
            for pid in _descendants(self.root):
                got = _rss_and_role(pid, self.root)
                if got:
                    rss, anon, role = got
                    now[role] = now.get(role, 0) + rss
                    now[f"{role}_anon"] = now.get(f"{role}_anon", 0) + anon
                    if role == "query_workers":  # what the workers hold together (shared shard pages once)
                        now["query_workers_pss"] = now.get("query_workers_pss", 0) + pss_bytes(pid)
            now["tree"] = sum(v for k, v in now.items() if not k.endswith(("_anon", "_pss")))
            now["tree_anon"] = sum(v for k, v in now.items() if k.endswith("_anon"))
            for role, rss in now.items():
                self.peaks[role] = max(self.peaks.get(role, 0), rss)
            self._done.wait(self.interval)

    def stop(self) -> dict:
        self._done.set()
        self.join()
        return {f"peak_rss_{role}_mb": round(v / 2**20, 1) for role, v in sorted(self.peaks.items())}


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (listed first: once the parent dies they are reparented)."""
    for p in reversed(_descendants(pid)):
        try:
            os.kill(p, 9)
        except OSError:
            pass


def run_job(args: list[str], log: Path, env: dict | None = None, timeout: float | None = None) -> dict:
    """A `sira` job (or any `python -m` module when args start with -m) in a subprocess: seconds, memory, output.
    Past `timeout` seconds the job's process tree is killed and RuntimeError raised."""
    cmd = [sys.executable, *(args if args[0] == "-m" else ["-m", "sira.jobs.cli", *args])]
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        memory = TreeMemory(proc.pid)
        memory.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            memory.stop()
            raise RuntimeError(f"{' '.join(args)} ran past {timeout} s and was killed; its log: {log}") from None
    seconds = time.perf_counter() - started
    peaks = memory.stop()
    if rc != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {rc}); its log: {log}\n{log.read_text()[-3000:]}")
    return {"seconds": round(seconds, 2), **peaks, "command": "sira " + " ".join(args)}


def table_bytes(warehouse: Path) -> dict[str, int]:
    out = {}
    for table in sorted(p for p in warehouse.iterdir() if p.is_dir()):
        out[table.name] = sum(f.stat().st_size for f in table.rglob("*") if f.is_file())
    return out


# ---------------------------------------------------------------- steps ----------------------------------------


def bm25s_index_worker(corpus: str) -> None:
    """Subprocess: bm25s tokenize + index of the corpus's texts, one thread; prints a JSON line."""
    import resource

    import bm25s
    import pyarrow.parquet as pq
    import Stemmer

    table = pq.read_table(corpus, columns=["title", "text"])
    texts = [f"{t} {x}" if t else x for t, x in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]
    del table
    started = time.perf_counter()
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
    tokenized = time.perf_counter()
    model = bm25s.BM25(method="lucene")
    model.index(tokens, show_progress=False)
    done = time.perf_counter()
    print(json.dumps({"docs": len(texts), "tokenize_seconds": tokenized - started, "index_seconds": done - tokenized,
                      "seconds": done - started, "docs_per_s": len(texts) / (done - started),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "postings": int(model.scores["data"].shape[0])}))


def load_worker(warehouse: str) -> None:
    """Subprocess: load the newest `sira` index from Delta into a searcher; prints a JSON line."""
    import resource

    from sira.pipelines.serving.shard_loader import load_searcher

    started = time.perf_counter()
    searcher, manifest = load_searcher(warehouse, preset="sira")
    seconds = time.perf_counter() - started
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * PAGE
    print(json.dumps({"seconds": seconds, "rss_mb": rss / 2**20, "index_version": manifest["index_version"],
                      "segments": manifest["segments"], "num_docs": manifest["num_docs"],
                      "postings": sum(len(s.doc_ords) for s in searcher.shards),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


QUERY_KS = (10, 1000)
FEEDBACK_DOCS, EXPANSION_TERMS, EXPANSION_WEIGHT = 10, (30, 60), 0.5


def feedback_expansions(searcher, df, plain: list, snapshot: str, tau: float, seed: int) -> list[list[str]]:
    """Per plain query: 30-60 terms of its FEEDBACK_DOCS best documents (their text from the snapshot the index
    was built from, through the index's analyzer) with 0 < DF <= tau x N in the index, absent from the query; most
    feedback documents first, then rarer first, then the term. Pseudo-relevance feedback: expansions that look like
    a proposer's (terms the index holds, near the query's documents), made without a model."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from sira.core.analysis import index_text

    rankings = searcher.rank_many(plain, FEEDBACK_DOCS)
    wanted = sorted({d for r in rankings for d in r.doc_ids.to_pylist()})
    rows = pads.dataset(snapshot).to_table(columns=["doc_id", "title", "text"],
                                           filter=pc.field("doc_id").isin(wanted))
    terms_of = {d: set(searcher.analyzer.terms(index_text(t or "", x))) for d, t, x in zip(
        *(rows.column(c).to_pylist() for c in ("doc_id", "title", "text")))}
    out = []
    for i, (query, ranking) in enumerate(zip(plain, rankings)):
        feedback: dict[str, int] = {}
        for d in ranking.doc_ids.to_pylist():
            for t in terms_of.get(d, ()):
                feedback[t] = feedback.get(t, 0) + 1
        found = df.lookup(sorted(set(feedback) - set(query.terms)))
        cands = sorted((t for t, n in found.items() if 0 < n <= tau * df.num_docs),
                       key=lambda t: (-feedback[t], found[t], t))
        n = int(np.random.default_rng([seed, i]).integers(EXPANSION_TERMS[0], EXPANSION_TERMS[1] + 1))
        out.append(cands[:n])
    return out


def query_speed_worker(warehouse: str, snapshot: str) -> None:
    """Subprocess: the newest `sira` index of the warehouse (its shard cache, as the load step left it): q/s of
    the 300 scifact test queries, plain and expanded (feedback_expansions, weight 0.5), at k 10 and 1000, with
    the searcher's default scorer, one thread (best of 5 repetitions of >= 1 s); and its memory per posting,
    resident (every mapped page touched) and arrays alone. Prints a JSON line."""
    import numpy as np

    from bench.query_speed import best_time, rss_bytes_now
    from sira.core.datasets import resolve_dataset
    from sira.core.defaults import DEFAULT_TAU
    from sira.core.search import QueryPart, compile_query
    from sira.pipelines.serving.shard_loader import load_df_table, load_searcher

    rss_before = rss_bytes_now()
    searcher, manifest = load_searcher(warehouse, preset="sira")
    texts = list(resolve_dataset("beir:scifact").queries("test").values())
    plain = [compile_query([QueryPart(tuple(searcher.analyzer.terms(t)))]) for t in texts]
    df = load_df_table(warehouse, manifest)
    expansions = feedback_expansions(searcher, df, plain, snapshot, DEFAULT_TAU, seed=7)
    del df
    expanded = [compile_query([QueryPart(q.terms), QueryPart(tuple(e), EXPANSION_WEIGHT, "expansion")])
                for q, e in zip(plain, expansions)]
    qps = {}
    for kind, queries in (("plain", plain), ("expanded", expanded)):
        for k in QUERY_KS:
            seconds, _ = best_time(lambda: searcher.rank_many(queries, k), 5, 1.0)
            qps[f"{kind}_k{k}"] = round(len(queries) / seconds, 1)
    for shard in searcher.shards:  # every page of every mapped array, so that all of the index counts as resident
        for values in shard.arrays().values():
            int(values.reshape(-1).view(np.uint8)[:: 4096].sum())
    postings = sum(len(s.doc_ords) for s in searcher.shards)
    print(json.dumps({"index_version": manifest["index_version"], "num_docs": manifest["num_docs"],
                      "segments": manifest["segments"], "postings": postings, "qps": qps,
                      "query_terms": {"plain": float(np.mean([len(q.term_ids) for q in plain])),
                                      "expanded": float(np.mean([len(q.term_ids) for q in expanded]))},
                      "resident_bytes_per_posting": round((rss_bytes_now() - rss_before) / postings, 3),
                      "index_bytes_per_posting": round(sum(s.nbytes() for s in searcher.shards) / postings, 3)}))


def _worker_json(module_args: list[str], log: Path, env: dict | None = None) -> dict:
    run = run_job(["-m", "bench.scale", *module_args], log, env=env)
    line = [ln for ln in log.read_text().splitlines() if ln.startswith("{")][-1]
    return {**json.loads(line), "wall_seconds": run["seconds"]}


def peaks_by_group(runs: list[dict]) -> dict[str, float]:
    """The highest peak of each process group (driver, jvm, python_workers, other, tree) over some jobs' runs, MB."""
    out: dict[str, float] = {}
    for run in runs:
        for key, mb in run.items():
            if key.startswith("peak_rss_") and not key.endswith(("_anon_mb", "_pss_mb")):
                group = key.removeprefix("peak_rss_").removesuffix("_mb")
                out[group] = max(out.get(group, 0.0), mb)
    return out


def measure(args) -> dict:
    from bench import nights as nb  # nights imports this module: imported late
    from bench import instant_openai

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    cores = os.cpu_count() or 1
    n = args.docs
    corpus = work / f"corpus-{n}-s{args.seed}.parquet"
    if not corpus.exists():
        print(f"generating {n} documents -> {corpus}", flush=True)
        write_parquet(corpus, iter_documents(n, args.seed))
    wh = work / f"wh-{n}"
    if wh.exists():
        shutil.rmtree(wh)
    (work / "mlflow.db").unlink(missing_ok=True)
    steps: dict = {}

    def step(name: str, fn):
        print(f"[{datetime.now():%H:%M:%S}] {name}", flush=True)
        steps[name] = fn()
        print(f"    {json.dumps(steps[name])[:300]}", flush=True)
        return steps[name]

    with instant_openai.start(max_seconds=(args.nights + 4) * args.job_timeout) as server:
        # The default night's denominator: ingest + enrich + index of the whole corpus, one `sira nightly`.
        full = step("full enriched build", lambda: nb.full_build(
            "nightly", corpus, wh, server.base_url, work, "full", args.job_timeout))
        full["docs_per_s_per_core"] = round(n / full["seconds"] / cores, 1)
        steps["table_bytes_after_full_build"] = table_bytes(wh)
        snapshot, nights = corpus, []
        for i in range(1, args.nights + 1):
            nxt = work / f"night-{n}-s{args.seed}-{i:02d}.parquet"
            nb.write_next_snapshot(snapshot, nxt, args.changed_fraction, args.seed, i)
            snapshot, out = nxt, logs / f"night-{i:02d}.json"
            run = step(f"night {i}", lambda: run_job(nb.nightly_args(wh, snapshot, server.base_url, work, out),
                                                     logs / f"night-{i:02d}.log", timeout=args.job_timeout))
            summary = json.loads(out.read_text())
            run.update(fraction_of_full_build=round(run["seconds"] / full["seconds"], 4),
                       step_seconds={k: round(v, 2) for k, v in summary["step_seconds"].items()},
                       index_version=summary["index_version"])
            nights.append(run)
        server.stop()
    steps["table_bytes_after_nights"] = table_bytes(wh)
    with tempfile.TemporaryDirectory(prefix="shard-cache-", dir=work) as cache:
        env = {"SIRA_SHARD_CACHE": cache}  # the load is cold (no cache); query speed maps what it wrote
        step("load sira index from Delta", lambda: _worker_json(["--load", str(wh)], logs / "load.log", env))
        speed = step("query speed", lambda: _worker_json(["--query-speed", str(wh), str(snapshot)],
                                                         logs / "query-speed.log", env))
    if not args.skip_bm25s:
        # The preset bm25s is compared with (unigrams, no enrichment) on the same warehouse, and bm25s itself.
        out = work / "index-pyserini-flat.json"
        flat = step("index pyserini-flat", lambda: run_job(
            ["index", "-w", str(wh), "--preset", "pyserini-flat", "--no-enrichment", "--full", "--output-json",
             str(out)], logs / "index-pyserini-flat.log"))
        flat["docs_per_s_per_core"] = round(n / flat["seconds"] / cores, 1)
        flat["build_step_seconds"] = json.loads(out.read_text())["step_seconds"]
        step("bm25s index", lambda: _worker_json(["--bm25s-index", str(corpus)], logs / "bm25s-index.log"))
    if not args.skip_searcher:
        from bench.searcher_scale import measure_searcher

        step("searcher", lambda: measure_searcher(n, seed=args.seed, work_dir=work / "searcher"))
    if not args.skip_enrich:
        from bench.enrich_overhead import measure_enrich_overhead

        step("enrich overhead", lambda: measure_enrich_overhead(min(n, args.enrich_docs), work / "enrich"))
    flat, bm25s = steps.get("index pyserini-flat"), steps.get("bm25s index")
    searcher = steps.get("searcher", {})
    fractions = sorted(x["fraction_of_full_build"] for x in nights)
    return {
        "docs": n,
        "full_build_seconds": full["seconds"],
        "nightly_seconds": [x["seconds"] for x in nights],
        "nightly_fraction_of_full_build": fractions[len(fractions) // 2] if fractions else None,
        "nightly_fraction_max": fractions[-1] if fractions else None,
        "load_seconds": round(steps["load sira index from Delta"]["seconds"], 2),
        "qps": speed["qps"],
        "index_bytes_per_posting": speed["index_bytes_per_posting"],
        "resident_bytes_per_posting": speed["resident_bytes_per_posting"],
        # Each process group's peak over the full build and the nights (the searcher's is the load's).
        "peak_rss_mb": {**peaks_by_group([full["run"], *nights]),
                        "searcher": round(steps["load sira index from Delta"]["peak_rss_mb"], 1)},
        "index_docs_per_s_per_core": flat["docs_per_s_per_core"] if flat else None,
        "index_docs_per_s_per_core_sira_preset": full["docs_per_s_per_core"],
        "index_ratio_vs_bm25s_per_core": round(flat["docs_per_s_per_core"] / bm25s["docs_per_s"], 3) if bm25s
        else None,
        "query_ratio_vs_bm25s_numba": searcher.get("query_ratio_vs_bm25s_numba"),
        "k1000_ratio_vs_bm25s_numba": searcher.get("k1000_ratio_vs_bm25s_numba"),
        "memory_ratio_vs_bm25s": searcher.get("memory_ratio_vs_bm25s"),
        "enrich_overhead_docs_per_s": steps.get("enrich overhead", {}).get("docs_per_s"),
        "changed_fraction": args.changed_fraction,
        "seed": args.seed,
        "cores": cores,
        "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
        "git_commit": nb.git_commit(),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "nights": nights,
        "steps": steps,
    }


def write_report(report: dict, path: Path | None) -> None:
    """The results as indented JSON on stdout, and in `path` when given."""
    text = json.dumps(report, indent=2) + "\n"
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int)
    ap.add_argument("--changed-fraction", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-scale"))
    ap.add_argument("--enrich-docs", type=int, default=200_000, help="documents of the enrichment overhead run")
    ap.add_argument("--nights", type=int, default=3, help="default nights after the full build")
    ap.add_argument("--job-timeout", type=float, default=6 * 3600, help="seconds any one job may run")
    ap.add_argument("--skip-bm25s", action="store_true",
                    help="no pyserini-flat index and no bm25s index (bm25s does not fit at 5M)")
    ap.add_argument("--skip-searcher", action="store_true")
    ap.add_argument("--skip-enrich", action="store_true")
    ap.add_argument("--output-json", type=Path)
    ap.add_argument("--bm25s-index", help=argparse.SUPPRESS)  # worker modes
    ap.add_argument("--load", help=argparse.SUPPRESS)
    ap.add_argument("--query-speed", nargs=2, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    from bench.nights import require_own_code

    args = parse_args(argv)
    require_own_code()
    if args.bm25s_index:
        return bm25s_index_worker(args.bm25s_index)
    if args.load:
        return load_worker(args.load)
    if args.query_speed:
        return query_speed_worker(*args.query_speed)
    if not args.docs:
        raise SystemExit("--docs is required")
    write_report(measure(args), args.output_json)


if __name__ == "__main__":
    main()
