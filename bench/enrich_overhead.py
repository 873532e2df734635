"""What the enrichment pipeline costs around the model: `sira enrich --backend openai` against a server that
answers every request at once, so only our side is measured (Ray Data, HTTP client, parsing, Delta commits).

    python bench/enrich_overhead.py --docs 200000 [--workdir DIR] [--output-json bench/results/enrich_overhead.json]

Steps: `--docs` synthetic documents (`bench/synthetic_corpus.py`, seed 7; the Parquet file is kept in the workdir and
reused) are ingested into a fresh warehouse; `bench/instant_openai.py` starts in its own process on 127.0.0.1; the
real job runs in this process through `sira.jobs.enrich.run`, with the job's defaults, which is
`sira enrich -w WH --backend openai --model instant --base-url URL` (a fresh local Ray, started by the job).

Reported:
- `docs_per_s`: documents committed per second of the job (Ray start and the closing compaction included);
  `steady_docs_per_s` the same from the first commit to the last; `first_commit_s` when the first commit landed;
- CPU seconds (user, system) of this process (the driver) and of the Ray processes it started (sampled from /proc
  every half second, so a process that ends between samples loses at most that much), and the server's own;
- the most requests the job kept in flight (connections the server saw open at once);
- each commit: rows, the table's rows and files after it, seconds; and the median commit seconds of the first and
  the last fifth of the job, so one sees whether a commit costs more as the table grows.

`measure_enrich_overhead(num_docs, workdir)` is the same as a function (bench/scale.py calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

import instant_openai  # noqa: E402
from synthetic_corpus import iter_documents, write_parquet  # noqa: E402

MODEL = "instant"
SEED = 7


class TreeCPU:
    """CPU seconds of this process's descendants (the Ray processes the job starts), sampled from /proc."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import psutil

        self._me = psutil.Process()
        self._interval_s = interval_s
        self._seen: dict[tuple[int, float], tuple[float, float]] = {}
        self._names: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)

    def _sample(self) -> None:
        import psutil

        for proc in self._me.children(recursive=True):
            try:
                times = proc.cpu_times()
                key = (proc.pid, proc.create_time())
                self._seen[key] = (times.user + times.children_user, times.system + times.children_system)
                self._names[key] = proc.name()
            except psutil.Error:
                pass  # ended since the listing

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def __enter__(self) -> "TreeCPU":
        self._sample()
        self._before = dict(self._seen)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()

    def user_by_name(self) -> dict[str, dict]:
        """User CPU seconds and process count per process name (Ray names a worker after what it runs)."""
        out: dict[str, dict] = {}
        for k, (u, _) in self._seen.items():
            entry = out.setdefault(self._names.get(k, "?"), {"user_s": 0.0, "processes": 0})
            entry["user_s"] += u - self._before.get(k, (0.0, 0.0))[0]
            entry["processes"] += 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["user_s"]))

    def seconds(self) -> tuple[float, float]:
        user = sum(u - self._before.get(k, (0.0, 0.0))[0] for k, (u, _) in self._seen.items())
        system = sum(s - self._before.get(k, (0.0, 0.0))[1] for k, (_, s) in self._seen.items())
        return user, system


@contextmanager
def own_cpu() -> Iterator[dict]:
    before = resource.getrusage(resource.RUSAGE_SELF)
    out: dict = {}
    yield out
    after = resource.getrusage(resource.RUSAGE_SELF)
    out.update(user=after.ru_utime - before.ru_utime, system=after.ru_stime - before.ru_stime)


def corpus(num_docs: int, workdir: Path) -> Path:
    path = workdir / f"corpus-{num_docs}-seed{SEED}.parquet"
    if not path.exists():
        write_parquet(path, iter_documents(num_docs, SEED))
    return path


def commit_growth(commits: list[dict]) -> dict:
    """Median commit seconds of the first and the last fifth of the commits (at least one each)."""
    if not commits:
        return {}
    fifth = max(1, len(commits) // 5)
    first, last = commits[:fifth], commits[-fifth:]
    return {
        "commits_per_fifth": fifth,
        "first_fifth_median_s": statistics.median(c["seconds"] for c in first),
        "first_fifth_table_rows": [first[0]["table_rows"], first[-1]["table_rows"]],
        "last_fifth_median_s": statistics.median(c["seconds"] for c in last),
        "last_fifth_table_rows": [last[0]["table_rows"], last[-1]["table_rows"]],
    }


def measure_enrich_overhead(num_docs: int, workdir: str | Path, profile: str | Path | None = None,
                            backend: dict | None = None, job: dict | None = None) -> dict:
    """Ingest `num_docs` synthetic documents into a fresh warehouse under `workdir`, enrich them all against the
    instant server, and return the measurements (top-level `docs_per_s`)."""
    from sira.jobs import enrich as enrich_job
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.enrichment.backend_config import BackendConfig

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    source = corpus(num_docs, workdir)
    warehouse = workdir / f"warehouse-{num_docs}"
    shutil.rmtree(warehouse, ignore_errors=True)
    started = time.perf_counter()
    ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=str(warehouse)))
    ingest_s = time.perf_counter() - started

    commits: list[dict] = []
    table_rows = 0

    def on_commit(stats: dict) -> None:
        nonlocal table_rows
        table_rows += stats["rows"]  # a fresh warehouse: every row is a new key
        commits.append({**stats, "table_rows": table_rows, "at_s": time.perf_counter() - job_started})

    with instant_openai.start(max_seconds=4 * 3600) as server:
        cfg = enrich_job.EnrichConfig(warehouse=str(warehouse), **(job or {}),
                                      backend=BackendConfig(backend="openai", model=MODEL, base_url=server.base_url,
                                                            **(backend or {})))
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
        with own_cpu() as driver_cpu, TreeCPU() as ray_cpu:
            job_started = time.perf_counter()
            if profiler:
                profiler.enable()
            summary = enrich_job.run(cfg, on_commit=on_commit)
            if profiler:
                profiler.disable()
            job_s = time.perf_counter() - job_started
        server_stats = server.stop()
    if profiler:
        profiler.dump_stats(str(profile))
    import ray

    ray.shutdown()

    done = summary["enriched"] + summary["errors"]
    if done != num_docs or summary["errors"]:
        raise RuntimeError(f"the job enriched {summary['enriched']} of {num_docs} documents with "
                           f"{summary['errors']} errors; first commits: {commits[:3]}")
    steady = None
    if len(commits) > 1:
        rows = sum(c["rows"] for c in commits[1:])
        steady = rows / (commits[-1]["at_s"] - commits[0]["at_s"])
    ray_user, ray_system = ray_cpu.seconds()
    return {
        "docs": num_docs,
        "docs_per_s": done / job_s,
        "steady_docs_per_s": steady,
        "first_commit_s": commits[0]["at_s"] if commits else None,
        "job_seconds": job_s,
        "ingest_seconds": ingest_s,
        "cpu_seconds": {"driver_user": driver_cpu["user"], "driver_system": driver_cpu["system"],
                        "ray_user": ray_user, "ray_system": ray_system,
                        "user_total": driver_cpu["user"] + ray_user, "ray_user_by_process": ray_cpu.user_by_name(),
                        "server_user": server_stats["user_cpu_s"], "server_system": server_stats["system_cpu_s"]},
        "requests": server_stats["requests"],
        "max_requests_in_flight": server_stats["max_open_connections"],
        "commit_count": len(commits),
        "commit_seconds_total": sum(c["seconds"] for c in commits),
        "commit_growth": commit_growth(commits),
        "commits": commits,
        "job_summary": summary,
        "config": json.loads(cfg.model_dump_json()),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/sira-enrich-overhead"),
                    help="corpus (kept and reused) and warehouse (made afresh)")
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the driver (pstats) here")
    ap.add_argument("--output-json", type=Path, default=None)
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    result = measure_enrich_overhead(args.docs, args.workdir, args.profile)
    report = {
        "command": "python bench/enrich_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "job_command": f"sira enrich -w WH --backend openai --model {MODEL} --base-url URL (sira.jobs.enrich.run in process)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average_start": load_before, "load_average_end": os.getloadavg()},
        "enrich_overhead_docs_per_s": result["docs_per_s"],
        **result,
    }
    cpu = result["cpu_seconds"]
    growth = result["commit_growth"]
    print(f"{args.docs} docs: {result['docs_per_s']:.0f} docs/s (steady {result['steady_docs_per_s'] or 0:.0f}) "
          f"in {result['job_seconds']:.1f} s; user CPU {cpu['user_total']:.1f} s (driver {cpu['driver_user']:.1f}, "
          f"Ray {cpu['ray_user']:.1f}), server {cpu['server_user']:.1f} s; {result['max_requests_in_flight']} "
          f"requests in flight at most; {result['commit_count']} commits, {result['commit_seconds_total']:.1f} s, "
          f"median {growth.get('first_fifth_median_s', 0):.3f} s first fifth, "
          f"{growth.get('last_fifth_median_s', 0):.3f} s last fifth")
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
