"""Peak bytes in Spark's local directories during a full enriched build, against the warehouse it writes.

    python bench/spark_local_disk.py --corpus CORPUS.parquet --work-dir /tmp/sira-local-disk
                                     [--local-dir /tmp] --output-json bench/results/spark_local_disk_200k.json

The build is bench/nights.full_build ("nightly": `sira nightly --source CORPUS` on an empty warehouse, enrichment
through bench/instant_openai.py). Every 2 s a thread sums the files under LOCAL_DIR/blockmgr-* (where a local
Spark keeps persisted frames, shuffle files and sort spills; `spark.local.dir`, /tmp by default); the report has the
peak above what was there before, when in the build it came, and the warehouse's bytes after the build. The report also has the bytes by kind at the peak (rdd_*: persisted
frames; shuffle_*; other: temp_* spills), a timeline every 2 s, and the index build's seconds per step. Walking the
files costs some CPU: the build's seconds here are not its speed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import instant_openai  # noqa: E402
from bench.nights import full_build, git_commit, require_own_code  # noqa: E402
from bench.scale import write_report  # noqa: E402


def local_bytes(local_dir: str) -> dict:
    """Bytes under LOCAL_DIR/blockmgr-* by kind: persisted frames (rdd_*), shuffle files (shuffle_*), the rest
    (temp_* sort spills and others), and their total."""
    kinds = {"rdd": 0, "shuffle": 0, "other": 0}
    # A local session's scratch is LOCAL_DIR/sira-spark/pid-N (sira.pipelines.storage.spark_session); Spark's own default
    # is LOCAL_DIR itself.
    for folder in glob.glob(os.path.join(local_dir, "blockmgr-*")) + glob.glob(
            os.path.join(local_dir, "sira-spark", "pid-*", "blockmgr-*")):
        for root, _, files in os.walk(folder):
            for name in files:
                kind = name.split("_", 1)[0] if name.startswith(("rdd_", "shuffle_")) else "other"
                try:
                    kinds[kind] += os.path.getsize(os.path.join(root, name))
                except OSError:  # removed while walking
                    pass
    return {**kinds, "total": sum(kinds.values())}


def measure(args) -> dict:
    before, started = local_bytes(args.local_dir)["total"], time.time()
    peak, timeline = {"bytes": 0, "at_s": None, "kinds": None}, []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now, at = local_bytes(args.local_dir), round(time.time() - started, 1)
            timeline.append({"t": at, **{k: round(v / 2**20) for k, v in now.items()}})
            if now["total"] > peak["bytes"]:
                peak.update(bytes=now["total"], at_s=at, kinds={k: now[k] for k in ("rdd", "shuffle", "other")})
            done.wait(2.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    (args.work_dir / "logs").mkdir(parents=True, exist_ok=True)
    with instant_openai.start(max_seconds=4 * 3600) as server:
        build = full_build("nightly", args.corpus, args.work_dir / "wh", server.base_url, args.work_dir, "full",
                           4 * 3600)
        server.stop()
    done.set()
    sampler.join()
    warehouse = sum(f.stat().st_size for f in (args.work_dir / "wh").rglob("*") if f.is_file())
    local_peak = peak["bytes"] - before
    return {"corpus": str(args.corpus), "build_seconds": build["seconds"], "step_seconds": build["step_seconds"],
            "local_dir_peak_bytes": local_peak, "peak_at_s": peak["at_s"], "peak_bytes_by_kind": peak["kinds"],
            "local_dir_before_bytes": before, "index_step_seconds": index_steps(args.work_dir / "logs" / "full.log"),
            "warehouse_bytes": warehouse, "local_peak_over_warehouse": round(local_peak / warehouse, 2),
            "command": "python bench/spark_local_disk.py " + " ".join(sys.argv[1:]), "git_commit": git_commit(),
            "timeline_mb": timeline}


def index_steps(log_path: Path) -> dict:
    """The index build's seconds per step, from its "build steps:" line (wrapped by the console) in the job's log."""
    text = " ".join(log_path.read_text().split())
    found = re.search(r"build steps: (.*?publish [0-9.]+ s)", text)
    if not found:
        return {}
    return {name: float(s) for name, s in re.findall(r"([a-z][a-z ]*?) ([0-9.]+) s(?:,|$)", found.group(1))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-local-disk"))
    ap.add_argument("--local-dir", default="/tmp", help="where the local Spark keeps its blockmgr-* folders")
    ap.add_argument("--output-json", type=Path)
    args = ap.parse_args(argv)
    require_own_code()
    write_report(measure(args), args.output_json)


if __name__ == "__main__":
    main()
