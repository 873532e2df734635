"""The build side at scale, in one run: ingest, index builds, loading, a night, the enrichment pipeline.

    python bench/scale.py --docs 1000000 [--changed-fraction 0.01] [--seed 7] [--work-dir /tmp/sira-scale]
                          --output-json bench/results/scale_1m.json

Everything runs through the real jobs with their default settings (the `sira` CLI in a subprocess of its own,
local Spark and Ray, Delta tables on local disk), on a synthetic corpus (bench/synthetic_corpus.py: resampled
BEIR sentences, natural lengths, a growing vocabulary). Steps, each timed and its process tree sampled for
memory every 0.2 s (the job's Python process, the Spark JVM, the Python workers):

1. `sira ingest corpus.parquet`: docs/s and peak memory.
2. `sira index --preset pyserini-flat --no-enrichment --full` and `--preset sira`: seconds, docs/s per core,
   peak memory of the driver and the JVM, bytes on disk per table.
3. bm25s (0.3.16; its own tokenizer with PyStemmer's English stemmer and its English stopwords, unigrams, as
   `bm25s.tokenize` + `BM25.index`) on the same documents, one thread: docs/s. Its ratio is ours per core over
   bm25s's (one core).
4. Loading the `sira` index from Delta into the searcher (sira.pipelines.shard_loader, a subprocess): seconds, memory.
5. The searcher against bm25s on the same corpus and analysed terms (bench/searcher_scale.measure_searcher).
6. A night: the corpus's next snapshot with `--changed-fraction` of its documents changed (60% updated, 20%
   deleted, 20% inserted), `sira nightly --no-enrichment --preset sira` (MERGE ingest, incremental index build,
   retention): seconds against ingest + full build of the same preset.
7. The enrichment pipeline's own cost: `sira enrich --backend openai` against an instantly answering loopback
   server (bench/enrich_overhead.measure_enrich_overhead), at min(--docs, --enrich-docs) documents.

The JSON's top level holds the issue's figures (ratios > 1: ours is better); `steps` holds the details.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.synthetic_corpus import change_set, iter_documents, write_parquet  # noqa: E402

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
    role = "driver" if pid == root else "jvm" if cmd.endswith("java") else "python_workers" if "python" in cmd \
        else "other"
    return rss, rss - shared, role


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
            now["tree"] = sum(v for k, v in now.items() if not k.endswith("_anon"))
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


def term_stats_rows(warehouse: Path, versions: list[int]) -> dict[str, int]:
    """term_stats rows each of `versions` wrote (its own, not those it sums)."""
    from deltalake import DeltaTable
    import pyarrow.dataset as ds

    data = DeltaTable(str(warehouse / "term_stats")).to_pyarrow_dataset()
    return {str(v): data.count_rows(filter=ds.field("index_version") == v) for v in versions}


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

    from sira.pipelines.shard_loader import load_searcher

    started = time.perf_counter()
    searcher, manifest = load_searcher(warehouse, preset="sira")
    seconds = time.perf_counter() - started
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * PAGE
    print(json.dumps({"seconds": seconds, "rss_mb": rss / 2**20, "index_version": manifest["index_version"],
                      "segments": manifest["segments"], "num_docs": manifest["num_docs"],
                      "postings": sum(s.num_postings for s in searcher.shards),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _worker_json(module_args: list[str], log: Path) -> dict:
    run = run_job(["-m", "bench.scale", *module_args], log)
    line = [ln for ln in log.read_text().splitlines() if ln.startswith("{")][-1]
    return {**json.loads(line), "wall_seconds": run["seconds"]}


def measure(args) -> dict:
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
    steps: dict = {}

    def step(name: str, fn):
        print(f"[{datetime.now():%H:%M:%S}] {name}", flush=True)
        steps[name] = fn()
        print(f"    {json.dumps(steps[name])[:300]}", flush=True)
        return steps[name]

    ingest = step("ingest", lambda: run_job(["ingest", str(corpus), "-w", str(wh)], logs / "ingest.log"))
    ingest["docs_per_s"] = round(n / ingest["seconds"], 1)
    for preset, extra in (("pyserini-flat", []), ("sira", [])):
        out = work / f"index-{preset}.json"
        run = step(f"index {preset}", lambda: run_job(
            ["index", "-w", str(wh), "--preset", preset, "--no-enrichment", "--full", "--output-json", str(out),
             *extra], logs / f"index-{preset}.log"))
        run["docs_per_s_per_core"] = round(n / run["seconds"] / cores, 1)
        built = json.loads(out.read_text())
        run["build_step_seconds"], run["index_version"] = built["step_seconds"], built["index_version"]
    steps["table_bytes"] = table_bytes(wh)
    bm25s = step("bm25s index", lambda: _worker_json(["--bm25s-index", str(corpus)], logs / "bm25s-index.log"))
    step("load sira index from Delta", lambda: _worker_json(["--load", str(wh)], logs / "load.log"))
    if not args.skip_searcher:
        from bench.searcher_scale import measure_searcher

        step("searcher", lambda: measure_searcher(n, seed=args.seed, work_dir=work / "searcher"))
    snapshot = work / f"night-{n}-s{args.seed}-{args.changed_fraction}.parquet"
    if not snapshot.exists():
        write_parquet(snapshot, iter_documents(n, args.seed, change_set(n, args.changed_fraction, args.seed)))
    night = step("nightly", lambda: run_job(
        ["nightly", "-w", str(wh), "--source", str(snapshot), "--no-enrichment", "--preset", "sira",
         "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--output-json", str(work / "night.json")],
        logs / "nightly.log"))
    night["summary"] = json.loads((work / "night.json").read_text())
    # A night writes the term statistics its documents moved, not the whole vocabulary again.
    night["term_stats_rows"] = term_stats_rows(wh, [steps["index sira"]["index_version"],
                                                    night["summary"]["index_version"]])
    full = ingest["seconds"] + steps["index sira"]["seconds"]
    if not args.skip_enrich:
        from bench.enrich_overhead import measure_enrich_overhead

        step("enrich overhead", lambda: measure_enrich_overhead(min(n, args.enrich_docs), work / "enrich"))
    flat = steps["index pyserini-flat"]
    searcher = steps.get("searcher", {})
    return {
        "docs": n,
        "index_docs_per_s_per_core": flat["docs_per_s_per_core"],
        "index_docs_per_s_per_core_sira_preset": steps["index sira"]["docs_per_s_per_core"],
        "index_ratio_vs_bm25s_per_core": round(flat["docs_per_s_per_core"] / bm25s["docs_per_s"], 3),
        "query_ratio_vs_bm25s_numba": searcher.get("query_ratio_vs_bm25s_numba"),
        "k1000_ratio_vs_bm25s_numba": searcher.get("k1000_ratio_vs_bm25s_numba"),
        "memory_ratio_vs_bm25s": searcher.get("memory_ratio_vs_bm25s"),
        "nightly_seconds": night["seconds"],
        "nightly_fraction_of_full_build": round(night["seconds"] / full, 3),
        "enrich_overhead_docs_per_s": steps.get("enrich overhead", {}).get("docs_per_s"),
        "changed_fraction": args.changed_fraction,
        "seed": args.seed,
        "cores": cores,
        "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
    ap.add_argument("--skip-searcher", action="store_true")
    ap.add_argument("--skip-enrich", action="store_true")
    ap.add_argument("--output-json", type=Path)
    ap.add_argument("--bm25s-index", help=argparse.SUPPRESS)  # worker modes
    ap.add_argument("--load", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.bm25s_index:
        return bm25s_index_worker(args.bm25s_index)
    if args.load:
        return load_worker(args.load)
    if not args.docs:
        raise SystemExit("--docs is required")
    write_report(measure(args), args.output_json)


if __name__ == "__main__":
    main()
