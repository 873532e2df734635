"""Ingest's two parsing paths on the same Parquet snapshot, in one run: per record (what JSONL sources take, and what
Parquet sources took before 8dc044d) against a batch at a time (`parse_batch`, what Parquet sources take now).

    python bench/ingest_paths.py --docs 1000000 [--seed 7] [--repeats 2] [--work-dir /tmp/sira-ingest-paths]
                                 --output-json bench/results/ingest_paths_1m.json

For each path and repeat, in alternating order, two ingests each in a process of its own (`ingest` of
sira.pipelines.storage.ingest, no CLI or MLflow around it): a replace ingest of the synthetic corpus (bench/synthetic_corpus.py)
into an empty warehouse, then the MERGE ingest of its next snapshot, 1% changed, as a night runs it. Each has its
seconds and peak RSS. At the end, the two paths' `docs` tables are compared (they must be equal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.synthetic_corpus import change_set, iter_documents, write_parquet  # noqa: E402

PATHS = ("per_record", "columnar")


def ingest_worker(path: str, source: str, warehouse: str, mode: str) -> None:
    """One ingest in this process; prints its seconds and peak RSS as JSON."""
    from sira.pipelines.storage import ingest as m

    if path == "per_record":  # every source through parse_record, one record at a time
        m._Snapshot._columnar_rows = lambda self, advance: self._record_rows(advance)

    @contextlib.contextmanager
    def progress(*_):
        yield lambda n: None

    started = time.perf_counter()
    out = m.ingest(m.IngestConfig(source=source, warehouse=warehouse, mode=mode), progress)
    print(json.dumps({"seconds": round(time.perf_counter() - started, 2), "kept": out["kept"],
                      "changes": out.get("changes"),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def _run(path: str, source: Path, warehouse: Path, mode: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", path, str(source), str(warehouse), mode],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise RuntimeError(f"{path} {mode} ingest failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _docs(warehouse: Path):
    from deltalake import DeltaTable

    return DeltaTable(str(warehouse / "docs")).to_pyarrow_table(
        columns=["doc_id", "title", "text", "content_hash"]).sort_by("doc_id")


def measure(args) -> dict:
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{args.docs}-s{args.seed}.parquet"
    night = work / f"night-{args.docs}-s{args.seed}-0.01.parquet"
    if not corpus.exists():
        write_parquet(corpus, iter_documents(args.docs, args.seed))
    if not night.exists():
        write_parquet(night, iter_documents(args.docs, args.seed, change_set(args.docs, 0.01, args.seed)))
    runs: dict[str, list] = {p: [] for p in PATHS}
    for r in range(args.repeats):
        for path in PATHS if r % 2 == 0 else PATHS[::-1]:
            wh = work / f"wh-{path}"
            shutil.rmtree(wh, ignore_errors=True)
            replace = _run(path, corpus, wh, "replace")
            merge = _run(path, night, wh, "merge")
            runs[path].append({"replace": replace, "merge": merge})
            print(f"[{datetime.now():%H:%M:%S}] {path}: replace {replace['seconds']} s, merge {merge['seconds']} s",
                  flush=True)
    same = _docs(work / "wh-per_record").equals(_docs(work / "wh-columnar"))
    best = {p: {step: min(run[step]["seconds"] for run in runs[p]) for step in ("replace", "merge")} for p in PATHS}
    return {
        "docs": args.docs,
        "replace_docs_per_s": {p: round(args.docs / best[p]["replace"], 1) for p in PATHS},
        "replace_speedup": round(best["per_record"]["replace"] / best["columnar"]["replace"], 3),
        "merge_speedup": round(best["per_record"]["merge"] / best["columnar"]["merge"], 3),
        "best_seconds": best,
        "docs_tables_equal": same,
        "runs": runs,
        "seed": args.seed,
        "cores": os.cpu_count(),
        "command": "python bench/ingest_paths.py " + " ".join(sys.argv[1:]),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        ingest_worker(*argv[1:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-ingest-paths"))
    parser.add_argument("--output-json", type=Path)
    args = parser.parse_args(argv)
    result = measure(args)
    if not result["docs_tables_equal"]:
        raise SystemExit("the two paths wrote different docs tables")
    text = json.dumps(result, indent=2)
    print(text)
    if args.output_json:
        args.output_json.write_text(text + "\n")


if __name__ == "__main__":
    main()
