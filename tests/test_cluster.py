"""Real cluster managers on loopback, driven by the real `sira` CLI in subprocesses: a Spark standalone master and
worker that `sira index --spark-master` builds on, and a token-protected Ray head (`ray start --head`) that
`sira enrich` and `sira query --ray-address` attach to. Each result equals the local-mode one. Every daemon and
job runs in a session of its own, and each test stops exactly those sessions (`ray stop` would stop every Ray on
the machine, other users' included).

Ray resolves 127.0.0.1 to the host's own interface address unless multi-node clustering is off
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), so every Ray process here runs with it off: head, drivers and workers then
talk over loopback only."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace

import psutil
import pyspark
import pytest

from conftest import JOB_ENV, REPO, TINY_QUERIES
from sira.jobs import index as index_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.ray_enrich import ray_address
from sira.pipelines.serving.shard_loader import load_searcher

pytestmark = pytest.mark.integration

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
RAY = str(Path(sys.executable).parent / "ray")
ENABLE_CLUSTER = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK_RAY = {ENABLE_CLUSTER: "0"}
MODEL = "fake-model"
INPUT_TABLES = {"docs", "rejected"}
START_TIMEOUT_S = 180
JOB_TIMEOUT_S = 600


def free_ports(n: int) -> list[int]:
    """n distinct free ports: each socket stays bound until all are picked, or a port closed a moment ago may come
    back twice (a master's web UI and a worker's once shared one, and the master's JSON came from the worker)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port() -> int:
    return free_ports(1)[0]


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error, ProcessLookupError):
            if os.getsid(proc.pid) == sid:
                found.append(proc)
    return found


def stop_session(sid: int, first: tuple[str, ...] = (), last: tuple[str, ...] = ()) -> None:
    """Stop every process of one session (a daemon or job this module started, with all it spawned): SIGTERM in
    three rounds, the processes named in `first`, the others, those named in `last`; SIGKILL what outlives its
    round's grace period."""
    procs = []
    for proc in session_processes(sid):
        with suppress(psutil.Error):
            procs.append((proc, proc.name()))
    rounds = [[p for p, name in procs if name in first],
              [p for p, name in procs if name not in first + last],
              [p for p, name in procs if name in last]]
    for batch in rounds:
        for proc in batch:
            with suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(batch, timeout=15)
        for proc in alive:
            with suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)


def start_daemon(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(ready, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not come up:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def run_job(args: list[str], env: dict[str, str], log: Path) -> int:
    """`python -m sira.jobs.cli ARGS` in a session of its own; stops whatever it leaves behind; returns its pid."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sira.jobs.cli", *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    stop_session(proc.pid)
    assert code == 0, f"sira {args[0]} ended with {code}:\n{log.read_text()[-4000:]}"
    return proc.pid


def ingested(root: Path, source: Path) -> str:
    warehouse = str(root / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=warehouse))
    return warehouse


def table_rows(warehouse: str, table: str, drop: tuple[str, ...] = ()) -> list[dict]:
    """A table's rows in a canonical order, without its timestamps (when a row was written) and `drop`."""
    t = read_table(f"{warehouse}/{table}")
    keep = [f.name for f in t.schema if f.name not in drop and not str(f.type).startswith("timestamp")]
    return sorted(t.select(keep).to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def tables_of(warehouse: str) -> set[str]:
    return {p.name for p in Path(warehouse).iterdir() if (p / "_delta_log").is_dir()}


# --- Spark standalone ---------------------------------------------------------------------------------------------


@pytest.fixture
def spark_standalone(tmp_path):
    """A master and one worker (1 core, 1 GiB) on 127.0.0.1. The worker gets this process's environment, so its
    executors' Python workers import sira from the same place the tests do, as on nodes where the package is
    installed."""
    port, web, worker_web = free_ports(3)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "512m",
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    url = f"spark://127.0.0.1:{port}"
    work = tmp_path / "spark-work"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"

    def state() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/json/", timeout=5) as answer:
            return json.load(answer)

    def worker_alive() -> bool:
        with suppress(OSError):
            return state()["aliveworkers"] == 1
        return False

    master = start_daemon([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                           "--port", str(port), "--webui-port", str(web)], env, master_log)
    worker = None
    try:
        worker = start_daemon([SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                               "--webui-port", str(worker_web), "--cores", "1", "--memory", "1g",
                               "--work-dir", str(work)], env, worker_log)
        wait_until(worker_alive, "the Spark worker", worker_log)
        yield SimpleNamespace(url=url, state=state, work=work)
    finally:
        for daemon in (worker, master):
            if daemon is not None:
                stop_session(daemon.pid)


def test_index_on_a_spark_standalone_cluster_equals_the_local_build(tmp_path, tiny_beir, spark, spark_standalone):
    on_cluster = ingested(tmp_path / "cluster", tiny_beir)
    local = str(tmp_path / "local" / "wh")
    shutil.copytree(on_cluster, local)
    index_job.run(index_job.IndexConfig(warehouse=local, preset="sira", shards=2), spark=spark)

    # The driver binds to loopback too, so that the executors reach it there; it shuffles into as many partitions
    # as the local build (the session's Spark), few tiny tasks for the worker's one core.
    run_job(["index", "--warehouse", on_cluster, "--preset", "sira", "--shards", "2",
             "--spark-master", spark_standalone.url],
            {**JOB_ENV, "SPARK_LOCAL_IP": "127.0.0.1", "SIRA_SPARK_CONF": "spark.sql.shuffle.partitions=2"},
            tmp_path / "index.log")

    state = spark_standalone.state()
    assert [(app["name"], app["state"]) for app in state["completedapps"] + state["activeapps"]] == \
        [("sira-index", "FINISHED")]
    # The executor fetched the Delta jars the driver resolved (spark.jars.packages).
    assert list(spark_standalone.work.glob("app-*/*/io.delta_delta-spark_*.jar"))

    assert tables_of(on_cluster) == tables_of(local)
    for table in tables_of(local) - INPUT_TABLES:
        assert table_rows(on_cluster, table) == table_rows(local, table), table
    cluster_searcher, _ = load_searcher(on_cluster)
    local_searcher, _ = load_searcher(local)
    for query in TINY_QUERIES.values():
        assert [(h.doc_id, h.score) for h in cluster_searcher.search(query, k=12)] == \
            [(h.doc_id, h.score) for h in local_searcher.search(query, k=12)]


# --- Ray head -----------------------------------------------------------------------------------------------------


def test_a_job_s_ray_is_the_flag_then_ray_address_then_a_ray_of_its_own(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"
    assert ray_address("10.0.0.5:6379") == "10.0.0.5:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert ray_address(None) == "10.0.0.9:6379"
    assert ray_address("10.0.0.5:6379") == "10.0.0.5:6379"


@contextmanager
def ray_cluster(nodes: int = 1):
    """`ray start --head` on loopback with token authentication and a token of its own (never the machine's
    ~/.ray/auth_token), and `nodes - 1` more `ray start` nodes joined to it. Its temp dir (RAY_TMPDIR) is private
    and short: Ray's Unix sockets live under it. Its workers get this process's environment, so they import sira as
    the tests do. Clients attach the documented way: RAY_AUTH_MODE=token and the token in RAY_AUTH_TOKEN.

    One node binds 127.0.0.1 alone (LOOPBACK_RAY turns Ray's multi-node mode off). Several need that mode, whose
    GCS listens on every interface (the token guards it), and an address other than 127.0.0.1: a joining node
    replaces 127.0.0.1 with the machine's own address, which the head does not advertise; 127.0.0.2 is loopback
    too."""
    root = Path(tempfile.mkdtemp(prefix="sira-ray-", dir="/tmp"))
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    ip, mode = ("127.0.0.1", LOOPBACK_RAY) if nodes == 1 else ("127.0.0.2", {ENABLE_CLUSTER: "1"})
    env = {**JOB_ENV, **mode, **auth, "RAY_TMPDIR": str(root)}
    port, *agent_ports = free_ports(1 + nodes)
    common = ["--node-ip-address", ip, "--num-cpus", "2", "--object-store-memory", str(256 * 1024**2),
              "--disable-usage-stats"]
    started = []
    try:
        for n, agent_port in enumerate(agent_ports):
            log = root / f"node{n}.log"
            role = ["--head", "--port", str(port), "--include-dashboard", "false"] if n == 0 else \
                ["--address", f"{ip}:{port}"]
            started.append(start_daemon([RAY, "start", *role, *common, "--dashboard-agent-listen-port",
                                         str(agent_port)], env, log))
            assert started[-1].wait(timeout=START_TIMEOUT_S) == 0, log.read_text()
        yield SimpleNamespace(address=f"{ip}:{port}", root=root, session=(root / "ray" / "session_latest").resolve(),
                              client_env={**JOB_ENV, **mode, **auth})
    finally:
        # `ray stop`'s order, the joined nodes first: the raylet first, the GCS last (it outlives a SIGTERM while
        # its clients are up).
        for daemon in reversed(started):
            stop_session(daemon.pid, first=("raylet",), last=("gcs_server",))
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    with ray_cluster() as head:
        yield head


def drivers_of(session: Path) -> set[int]:
    """The pids of the drivers that attached to a Ray session (Ray logs each one in the session's logs)."""
    return {int(p.stem.rsplit("_", 1)[1]) for p in (session / "logs").glob("python-core-driver-*_*.log")}


def openai_args(fake_openai) -> list[str]:
    return ["--backend", "openai", "--base-url", fake_openai.base_url, "--model", MODEL]


def test_enrich_attaches_to_a_ray_head_by_address_and_a_plain_run_starts_its_own(ray_head, fake_openai, tmp_path,
                                                                                  tiny_beir):
    on_head = ingested(tmp_path / "head", tiny_beir)
    local = str(tmp_path / "local" / "wh")
    shutil.copytree(on_head, local)

    attached = run_job(["enrich", "--warehouse", on_head, *openai_args(fake_openai), "--ray-address",
                        ray_head.address], ray_head.client_env, tmp_path / "enrich-head.log")
    # Issue 18: for this plain run the head is the machine's current cluster (its RAY_TMPDIR holds the head's
    # ray_current_cluster); the job must still run a Ray of its own, not attach to it.
    sessions = set((ray_head.root / "ray").glob("session_2*"))
    plain = run_job(["enrich", "--warehouse", local, *openai_args(fake_openai)],
                    {**JOB_ENV, **LOOPBACK_RAY, "RAY_TMPDIR": str(ray_head.root)}, tmp_path / "enrich-local.log")

    assert attached in drivers_of(ray_head.session) and plain not in drivers_of(ray_head.session)
    [own] = set((ray_head.root / "ray").glob("session_2*")) - sessions
    assert plain in drivers_of(own)
    rows = table_rows(on_head, "enrichment", drop=("latency_ms",))
    assert len(rows) == 12 and all(r["error"] is None and r["phrases"] for r in rows)
    assert rows == table_rows(local, "enrichment", drop=("latency_ms",))


def test_query_attaches_to_a_ray_head_by_address_and_ignores_a_dead_cluster(ray_head, fake_openai, tmp_path,
                                                                            tiny_beir, tiny_warehouse):
    on_head, local = str(tmp_path / "head" / "wh"), str(tmp_path / "local" / "wh")
    shutil.copytree(tiny_warehouse, on_head)
    shutil.copytree(tiny_warehouse, local)
    queries = str(tiny_beir / "queries.jsonl.gz")

    def query(where: str, *extra: str) -> list[str]:
        return ["query", "--warehouse", str(tmp_path / where / "wh"), "--queries", queries,
                "--out", str(tmp_path / where / "run.trec"), *openai_args(fake_openai), *extra]

    attached = run_job(query("head", "--ray-address", ray_head.address), ray_head.client_env,
                       tmp_path / "query-head.log")
    # Issue 18: what a cluster leaves behind once stopped, an address nothing answers at recorded as the machine's
    # current cluster. A plain job must not try to reach it.
    dead = Path(tempfile.mkdtemp(prefix="sira-ray-", dir="/tmp"))
    try:
        (dead / "ray").mkdir()
        (dead / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
        run_job(query("local"), {**JOB_ENV, **LOOPBACK_RAY, "RAY_TMPDIR": str(dead)}, tmp_path / "query-local.log")
    finally:
        shutil.rmtree(dead, ignore_errors=True)

    assert attached in drivers_of(ray_head.session)
    assert len(table_rows(on_head, "runs")) == len(TINY_QUERIES)
    assert table_rows(on_head, "runs") == table_rows(local, "runs")
    assert table_rows(on_head, "expansions", drop=("latency_ms",)) == \
        table_rows(local, "expansions", drop=("latency_ms",))
    assert (tmp_path / "head" / "run.trec").read_text() == (tmp_path / "local" / "run.trec").read_text()


def test_query_on_a_two_node_ray_cluster_spreads_the_shards_and_writes_the_local_run(tmp_path, tiny_beir, tiny_warehouse):
    on_cluster, local = str(tmp_path / "cluster" / "wh"), str(tmp_path / "local" / "wh")
    shutil.copytree(tiny_warehouse, on_cluster)
    shutil.copytree(tiny_warehouse, local)
    queries = str(tiny_beir / "queries.jsonl.gz")

    def query(where: str, *extra: str) -> list[str]:
        return ["query", "--warehouse", str(tmp_path / where / "wh"), "--queries", queries, "--out",
                str(tmp_path / where / "run.trec"), "--output-json", str(tmp_path / where / "summary.json"), *extra]

    with ray_cluster(nodes=2) as cluster:
        run_job(query("cluster", "--ray-address", cluster.address), cluster.client_env, tmp_path / "cluster.log")
    run_job(query("local", "--scorer", "local"), {**JOB_ENV, **LOOPBACK_RAY}, tmp_path / "local.log")

    summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert summary["shard_nodes"] == 2  # the newest index's 3 shards, spread over both nodes
    assert json.loads((tmp_path / "local" / "summary.json").read_text())["shard_nodes"] == 1
    cluster_run = (tmp_path / "cluster" / "run.trec").read_bytes()
    assert cluster_run and cluster_run == (tmp_path / "local" / "run.trec").read_bytes()
    assert table_rows(on_cluster, "runs") == table_rows(local, "runs")
