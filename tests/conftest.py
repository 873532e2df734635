"""Heavy fixtures are created once per test session: one local Spark, one tiny BEIR folder, one warehouse."""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

# The fake OpenAI-compatible server and its fixtures (fake_openai, fake_openai_server).
pytest_plugins = ["fake_openai"]

# Cached shards (sira.pipelines.serving.shard_cache) go to a folder of this test session, never to ~/.cache; jobs started as
# subprocesses inherit it.
SHARD_CACHE = tempfile.mkdtemp(prefix="sira-shard-cache-")
os.environ["SIRA_SHARD_CACHE"] = SHARD_CACHE
atexit.register(shutil.rmtree, SHARD_CACHE, True)

TINY_DOCS = [
    {"_id": "d01", "title": "Heart attack", "text": "Myocardial infarction, commonly called a heart attack, damages the heart muscle."},
    {"_id": "d02", "title": "Aspirin", "text": "Aspirin reduces the risk of heart attack and stroke in some patients."},
    {"_id": "d03", "title": "Stroke", "text": "A stroke happens when blood flow to the brain is blocked."},
    {"_id": "d04", "title": "Diabetes", "text": "Insulin resistance is a hallmark of type 2 diabetes mellitus."},
    {"_id": "d05", "title": "Insulin", "text": "Insulin is a hormone produced by the pancreas; insulin lowers blood glucose."},
    {"_id": "d06", "title": "Exercise", "text": "Regular exercise lowers blood pressure and the risk of heart disease."},
    {"_id": "d07", "title": "", "text": "Statins lower LDL cholesterol and prevent heart attacks."},
    {"_id": "d08", "title": "Sleep", "text": "Poor sleep is linked to obesity, diabetes and high blood pressure."},
    {"_id": "d09", "title": "Café culture", "text": "Coffee drinking at the café: caffeine raises alertness."},
    {"_id": "d10", "title": "Blood", "text": "Blood carries oxygen; blood pressure is measured in mmHg. Blood blood blood."},
    {"_id": "d11", "title": "Cholesterol", "text": "High cholesterol is a risk factor for heart disease and stroke."},
    {"_id": "d12", "title": "Glucose", "text": "Glucose monitoring helps patients with diabetes manage blood sugar."},
]
TINY_QUERIES = {
    "q1": "heart attack risk",
    "q2": "insulin and blood glucose",
    "q3": "blood pressure",
    "q4": "cafe caffeine",
    "q5": "zzzz unknownword",
}
TINY_QRELS = {"q1": {"d01": 1, "d02": 1}, "q2": {"d05": 2, "d12": 1}, "q3": {"d10": 1, "d06": 1}, "q4": {"d09": 1},
              "q5": {"d03": 1}}
# A train split for selection tests (sweeps select on it, never on test).
TINY_TRAIN_QRELS = {"q1": {"d01": 1}, "q2": {"d05": 1}, "q3": {"d06": 1}, "q4": {"d09": 1}}


def write_beir_folder(root: Path, docs=TINY_DOCS, queries=TINY_QUERIES, qrels=TINY_QRELS, split="test") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with gzip.open(root / "corpus.jsonl.gz", "wt", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d) + "\n")
    with gzip.open(root / "queries.jsonl.gz", "wt", encoding="utf-8") as fh:
        for qid, text in queries.items():
            fh.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (root / "qrels").mkdir(exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, rel in qrels.items() for d, r in rel.items()]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


REPO = Path(__file__).resolve().parents[1]
JOB_ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray, like a real run


def start_job(args: list[str], log: Path) -> subprocess.Popen:
    """`python -m sira.jobs.cli ARGS` in a session of its own, so that SIGKILL takes its whole process group (its local
    Ray and JVM included)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "sira.jobs.cli", *args], cwd=REPO, env=JOB_ENV, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_when(proc: subprocess.Popen, log: Path, landed: Callable[[], bool], timeout_s: float = 600) -> None:
    """SIGKILL the job's whole process group as soon as `landed()` holds."""
    try:
        deadline = time.monotonic() + timeout_s
        while not landed():
            assert proc.poll() is None, f"the job ended before the kill point:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the kill point never came:\n{log.read_text()}"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def committed_since(uri: str) -> Callable[[], bool]:
    """True once the Delta table at `uri` has a commit it did not have now (a kill point for kill_when)."""
    from sira.pipelines.storage.delta_io import table_version

    before = table_version(uri)
    return lambda: table_version(uri) != before


def require_local_model() -> None:
    """Skip unless the `local` extra (llama.cpp) and its packaged model are installed."""
    import importlib.util

    from sira.pipelines.enrichment import local_llm

    # find_spec, not importorskip: llama_cpp must first be imported after sira.pipelines.enrichment.local_llm (OMP_WAIT_POLICY).
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the `local` extra is not installed")
    try:
        local_llm.resolve_model(local_llm.DEFAULT_LOCAL_MODEL)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_beir(tmp_path_factory) -> Path:
    folder = write_beir_folder(tmp_path_factory.mktemp("data") / "tiny")
    return write_beir_folder(folder, qrels=TINY_TRAIN_QRELS, split="train")


@pytest.fixture(scope="session")
def spark():
    from sira.pipelines.storage.spark_session import get_spark

    # One JVM serves the whole suite (~100 builds). A hash relation built for a broadcast join holds at least one
    # memory page (32 MB at this heap by default) until the ContextCleaner frees it after a GC of the plan that
    # made it: with default pages, broadcasts awaiting their cleanup filled a 2 GB heap. Small pages fit tiny data.
    session = get_spark("local[2]", app_name="sira-tests",
                        conf={"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "2",
                              "spark.buffer.pageSize": "2m"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_warehouse(tmp_path_factory, tiny_beir, spark) -> str:
    """Tiny corpus ingested, then indexed twice with the sira preset: v1 with 1 shard, v2 with 3 shards."""
    from sira.jobs import index as index_job
    from sira.jobs import ingest as ingest_job

    wh = str(tmp_path_factory.mktemp("wh") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=1), spark=spark)
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=3), spark=spark)
    return wh
