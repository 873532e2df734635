"""Peak bytes in Spark's local directories during a full enriched build, against the warehouse it writes.

    python bench/spark_local_disk.py --corpus CORPUS.parquet --work-dir /tmp/sira-local-disk
                                     [--local-dir /tmp] --output-json bench/results/spark_local_disk_200k.json

The build is bench/nights.full_build ("nightly": `sira nightly --source CORPUS` on an empty warehouse, enrichment
through bench/instant_openai.py). Every 2 s a thread sums the files under LOCAL_DIR/blockmgr-* (where a local
Spark keeps persisted frames, shuffle files and sort spills; `spark.local.dir`, /tmp by default); the report has the
peak above what was there before, when in the build it came, and the warehouse's bytes after the build. Walking the
files costs some CPU: the build's seconds here are not its speed.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import instant_openai  # noqa: E402
from bench.nights import full_build, git_commit  # noqa: E402
from bench.scale import write_report  # noqa: E402


def local_bytes(local_dir: str) -> int:
    total = 0
    for folder in glob.glob(os.path.join(local_dir, "blockmgr-*")):
        for root, _, files in os.walk(folder):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except OSError:  # removed while walking
                    pass
    return total


def measure(args) -> dict:
    before, peak, started = local_bytes(args.local_dir), {"bytes": 0, "at_s": None}, time.time()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = local_bytes(args.local_dir)
            if now > peak["bytes"]:
                peak.update(bytes=now, at_s=round(time.time() - started, 1))
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
            "local_dir_peak_bytes": local_peak, "peak_at_s": peak["at_s"], "local_dir_before_bytes": before,
            "warehouse_bytes": warehouse, "local_peak_over_warehouse": round(local_peak / warehouse, 2),
            "command": "python bench/spark_local_disk.py " + " ".join(sys.argv[1:]), "git_commit": git_commit()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/sira-local-disk"))
    ap.add_argument("--local-dir", default="/tmp", help="where the local Spark keeps its blockmgr-* folders")
    ap.add_argument("--output-json", type=Path)
    args = ap.parse_args(argv)
    write_report(measure(args), args.output_json)


if __name__ == "__main__":
    main()
