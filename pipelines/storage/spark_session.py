"""A Spark session with Delta Lake configured (local[*] by default, any master by URL)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import SparkSession

from sira.core.defaults import DEFAULT_SPARK_MASTER
from sira.pipelines.storage.processes import alive

DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Adaptive execution coalesces small shuffle partitions and splits skewed joins; the index build sizes the
    # shuffle partitions from its input (sira.pipelines.index.build.size_shuffles) unless they are set explicitly.
    "spark.sql.adaptive.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
    # Broadcast relations and shuffle files are freed only after a GC finds their plans unreachable; a long build
    # whose heap rarely fills would otherwise keep every earlier step's broadcast pages.
    "spark.cleaner.periodicGC.interval": "5min",
}
# The share of the machine's memory a local-mode JVM takes as heap: local mode runs every task inside the driver,
# and the Python workers, this process and the page cache need the rest.
LOCAL_HEAP_SHARE = 0.4
# A local JVM compiles less: a night's index step spent nearly half its JVM CPU in the JIT compilers (C2 33 s, C1
# 8 s of ~90 CPU-s on 2 cores), compiling code it runs for a minute. Thresholds 5x higher compile only what is hot,
# which cut that to ~80 CPU-s and the step's wall by ~5% without slowing a full build (docs/benchmarks.md); 3x, 10x,
# 20x and C1 alone measured no better. A cluster's JVMs run long enough to repay the JIT: theirs are left alone.
LOCAL_JAVA_OPTIONS = "-XX:CompileThresholdScaling=5"


def local_driver_memory() -> str:
    """spark.driver.memory for local mode, from this machine's memory (1g at least)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"{max(1, int(total * LOCAL_HEAP_SHARE) >> 30)}g"


def local_scratch_root() -> Path:
    """Where local sessions keep their scratch folders (`local_scratch_dir`): TMPDIR/sira-spark."""
    return Path(tempfile.gettempdir()) / "sira-spark"


def local_scratch_dir(root: Path | None = None) -> str:
    """spark.local.dir for a local session: a folder of this process's own under `root`, after removing those of
    processes that are gone. Spark deletes its scratch (persisted frames, shuffle files, spills) when its JVM exits
    normally; a job killed mid-build (a timeout, the OOM killer) left it in /tmp for good, tens of GB for a 5M-document
    build, and nothing said whose it was."""
    root = root or local_scratch_root()
    root.mkdir(parents=True, exist_ok=True)
    remove_orphaned_scratch(root)
    mine = root / f"pid-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    return str(mine)


def remove_orphaned_scratch(root: Path) -> list[Path]:
    """Remove the pid-N folders under `root` whose process N is gone; returns them."""
    removed = []
    for folder in root.glob("pid-*"):
        pid = folder.name.removeprefix("pid-")
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def get_spark(master: str = DEFAULT_SPARK_MASTER, app_name: str = "sira", conf: dict[str, str] | None = None) -> SparkSession:
    from delta import configure_spark_with_delta_pip

    # Python workers must run the interpreter that has sira installed (the job's own venv in local mode).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        # A caller's, spark-submit's or Databricks' session (infra/spark/sira_index_main.py creates it first): its
        # master and --conf settings stand; getOrCreate would re-apply our local defaults over them.
        return active
    builder = SparkSession.builder.master(master).appName(app_name)
    machine = {"spark.driver.memory": local_driver_memory(),
               "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS} if master.startswith("local") else {}
    settings = {**DEFAULT_CONF, **machine, **_env_conf(), **(conf or {})}
    if master.startswith("local") and "spark.local.dir" not in settings and not os.environ.get("SPARK_LOCAL_DIRS"):
        settings["spark.local.dir"] = local_scratch_dir()  # a cluster's workers clean their own
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _env_conf() -> dict[str, str]:
    """SIRA_SPARK_CONF='k1=v1,k2=v2' overrides the defaults without code changes."""
    raw = os.environ.get("SIRA_SPARK_CONF", "")
    return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)


def start_in_background(master: str = DEFAULT_SPARK_MASTER, app_name: str = "sira") -> Future:
    """`get_spark` on a thread of its own, for a job that has other work to do first (a night's ingest): the JVM's
    start and Delta's jar resolution overlap that work. The caller takes the session with `.result()` and stops it."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-start")
    try:
        return pool.submit(get_spark, master, app_name)
    finally:
        pool.shutdown(wait=False)  # the thread ends with the start; nothing else runs on it


def stop_started(session: Future | None) -> None:
    """Stop a session from `start_in_background` once its start has ended (a failed start has nothing to stop)."""
    if session is not None and session.exception() is None:
        session.result().stop()
