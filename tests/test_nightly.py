"""`sira nightly`: incremental MERGE ingest, enrichment of new / changed docs only, atomic publish, retention, and
a following `sira serve` that switches versions under load (real Spark, Ray, Delta, MLflow on SQLite, loopback)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_DOCS, committed_since, kill_when, start_job
from fake_openai import document_of
from test_enrich_openai import assert_one_row_per_key
from sira.jobs import cli
from sira.jobs import nightly as nightly_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.index.retention import expire_versions, expired_versions
from sira.pipelines.index.catalog import IndexNotFound, find_index, published_versions
from sira.pipelines.serving.shard_loader import load_searcher
from sira.pipelines.tracking.tracking import TrackingConfig
from sira.core import tables
from sira.core.enrichment import document_input

pytestmark = pytest.mark.integration

CHANGED = {"_id": "d03", "title": "Stroke", "text": "A stroke happens when blood flow to the brain is blocked by a clot."}
ADDED = {"_id": "d13", "title": "Zebrafish", "text": "Zebrafish regenerate heart tissue after injury."}
NIGHT_2 = [CHANGED if d["_id"] == "d03" else d for d in TINY_DOCS if d["_id"] != "d08"] + [ADDED]


def snapshot(path: Path, docs) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    from sira.pipelines.enrichment.ray_enrich import init_ray

    init_ray()


def config(wh: str, source: str, fake, tmp_path: Path, **kw) -> nightly_job.NightlyConfig:
    backend = BackendConfig(backend="openai", model="fake-model", base_url=fake.base_url, timeout_s=5,
                            max_retries=1, retry_base_s=0.01, batch_size=4)
    return nightly_job.NightlyConfig(warehouse=wh, source=source, backend=backend, shards=2, spark_master="local[2]",
                                     tracking=TrackingConfig(root=str(tmp_path / "mlruns")), **kw)


def prompted_docs(fake) -> set[str]:
    return {document_of(r.prompt).rstrip() for r in fake.requests}


def test_nightly_updates_incrementally_and_publishes_a_new_version(tmp_path, fake_openai, spark):
    wh = str(tmp_path / "wh")
    fake_openai.reset("ok")
    first = nightly_job.run(config(wh, snapshot(tmp_path / "night1.jsonl", TINY_DOCS), fake_openai, tmp_path))
    assert first["ingested"] == {"inserted": 12, "updated": 0, "deleted": 0, "unchanged": 0}
    assert first["enriched"] == 12 and len(fake_openai.requests) == 12

    # Night 2 through the CLI: one doc changed, one deleted, one added; only the changed and added are enriched.
    fake_openai.reset("ok")
    out = tmp_path / "night2.json"
    result = CliRunner().invoke(cli.app, [
        "nightly", "--warehouse", wh, "--source", snapshot(tmp_path / "night2.jsonl", NIGHT_2), "--backend", "openai",
        "--model", "fake-model", "--base-url", fake_openai.base_url, "--shards", "2", "--spark-master", "local[2]",
        "--tracking-uri", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", "--output-json", str(out)])
    assert result.exit_code == 0, result.output
    second = json.loads(out.read_text())
    assert second["ingested"] == {"inserted": 1, "updated": 1, "deleted": 1, "unchanged": 10}
    assert second["enriched"] == 2
    assert prompted_docs(fake_openai) == {document_input(d["title"], d["text"]) for d in (CHANGED, ADDED)}
    assert second["index_version"] > first["index_version"]

    docs = {r["doc_id"]: r for r in read_table(tables.table_uri(wh, tables.DOCS)).to_pylist()}
    assert sorted(docs) == sorted(d["_id"] for d in NIGHT_2)
    searcher, manifest = load_searcher(wh)
    assert manifest["index_version"] == second["index_version"] and manifest["enriched"]
    assert searcher.search("zebrafish regenerate", k=1)[0].doc_id == "d13"
    assert "d08" not in {h.doc_id for h in searcher.search("sleep obesity", k=20)}
    # The previous version is still published and servable by version.
    old, _ = load_searcher(wh, index_version=first["index_version"])
    assert "d08" in {h.doc_id for h in old.search("sleep obesity", k=20)}

    # Night 3, same snapshot: nothing to ingest, enrich or build.
    fake_openai.reset("ok")
    third = nightly_job.run(config(wh, str(tmp_path / "night2.jsonl"), fake_openai, tmp_path))
    assert third["ingested"] == {"inserted": 0, "updated": 0, "deleted": 0, "unchanged": 12}
    assert (third["enriched"], third["index_version"], len(fake_openai.requests)) == (0, second["index_version"], 0)

    # Every step of every night is in MLflow: a parent run per night, a child run per step.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sira").experiment_id],
                              "tags.`sira.job` = 'nightly'", max_results=100)
    parents = [r for r in runs if "sira.step" not in r.data.tags]
    steps = [r.data.tags["sira.step"] for r in runs if "sira.step" in r.data.tags]
    assert len(parents) == 3 and steps.count("ingest") == 3 and steps.count("index (enriched)") == 3
    night2 = next(r for r in parents if r.info.run_id == second["mlflow_run_id"])
    assert night2.data.metrics["ingested.inserted"] == 1 and night2.data.metrics["enriched"] == 2

    # Retention: with a zero-day window every version but the newest goes; readers can no longer find them.
    gone = expire_versions(wh, keep_days=0)
    assert gone["expired_versions"] == [first["index_version"]] and gone["kept_versions"] == [second["index_version"]]
    with pytest.raises(IndexNotFound):
        find_index(wh, index_version=first["index_version"])
    # Segments go with the last version that lists them: the kept one still lists night 1's.
    kept_segments = find_index(wh)["segments"]
    for table in tables.PER_SEGMENT_TABLES:
        assert set(read_table(tables.table_uri(wh, table), columns=["segment"])["segment"].to_pylist()) == \
            set(kept_segments)
    # So do term_stats rows: the kept version's are night 2's change on top of night 1's whole statistics.
    stats = read_table(tables.table_uri(wh, tables.TERM_STATS), columns=["index_version"]).column("index_version")
    assert set(stats.to_pylist()) == set(tables.term_stats_versions_of(find_index(wh))) == \
        {first["index_version"], second["index_version"]}
    assert load_searcher(wh)[0].search("zebrafish", k=1)[0].doc_id == "d13"


# Night 2 of the kill test: seven changed, two added and one deleted document, so that a night killed in its
# enrichment has committed some of the nine proposals it asks for and not the others.
KILL_NIGHT_CHANGED = {"d01", "d02", "d03", "d04", "d05", "d06", "d07"}
KILL_NIGHT_2 = [{**d, "text": d["text"] + " Reviewed again in 2026."} if d["_id"] in KILL_NIGHT_CHANGED else d
                for d in TINY_DOCS if d["_id"] != "d08"] + [
    ADDED, {"_id": "d14", "title": "Sourdough", "text": "Lactobacilli and wild yeast leaven sourdough bread."}]
KILL_NIGHT_NEW = KILL_NIGHT_CHANGED | {ADDED["_id"], "d14"}  # the documents night 2 enriches


def test_a_night_killed_in_its_enrichment_resumes_to_the_index_of_an_uninterrupted_night(tmp_path, fake_openai,
                                                                                         spark):
    base = str(tmp_path / "base")
    fake_openai.reset("ok")
    nightly_job.run(config(base, snapshot(tmp_path / "night1.jsonl", TINY_DOCS), fake_openai, tmp_path))
    killed, reference = (str(shutil.copytree(base, tmp_path / name)) for name in ("killed", "reference"))
    source = snapshot(tmp_path / "night2.jsonl", KILL_NIGHT_2)
    published = [r["index_version"] for r in published_versions(killed)]
    to_enrich = [d for d in KILL_NIGHT_2 if d["_id"] in KILL_NIGHT_NEW]

    # The night as cron runs it, one request at a time and 0.3 s each: killed (its process group: Ray, the JVM) once
    # its enrichment has committed a first chunk of two.
    enrichment = tables.table_uri(killed, tables.ENRICHMENT)
    first_commit = committed_since(enrichment)
    fake_openai.reset("ok", delay_s=0.3)
    log = tmp_path / "killed.log"
    kill_when(start_job([
        "nightly", "--warehouse", killed, "--source", source, "--backend", "openai", "--model", "fake-model",
        "--base-url", fake_openai.base_url, "--timeout-s", "5", "--max-retries", "1", "--batch-size", "4",
        "--max-in-flight", "1", "--commit-every", "2", "--shards", "2", "--spark-master", "local[2]",
        "--no-tracking"], log), log, first_commit, timeout_s=300)
    docs = {r["doc_id"]: r["content_hash"] for r in read_table(tables.table_uri(killed, tables.DOCS)).to_pylist()}
    committed = {r["doc_id"] for r in read_table(enrichment).to_pylist() if r["content_hash"] == docs.get(r["doc_id"])
                 and r["doc_id"] in KILL_NIGHT_NEW}
    assert 0 < len(committed) < len(to_enrich), f"the night was not killed in its enrichment:\n{log.read_text()}"
    assert [r["index_version"] for r in published_versions(killed)] == published  # nothing of night 2 is served

    # The same night run again: nothing is ingested twice, only the proposals the killed night had not committed are
    # asked for, and the index it publishes is the uninterrupted night's.
    fake_openai.reset("ok")
    rerun = nightly_job.run(config(killed, source, fake_openai, tmp_path))
    assert rerun["ingested"] == {"inserted": 0, "updated": 0, "deleted": 0, "unchanged": len(KILL_NIGHT_2)}
    assert rerun["enriched"] == len(to_enrich) - len(committed)
    assert prompted_docs(fake_openai) == {document_input(d["title"], d["text"]) for d in to_enrich
                                          if d["_id"] not in committed}
    fake_openai.reset("ok")
    uninterrupted = nightly_job.run(config(reference, source, fake_openai, tmp_path))
    assert rerun["index_version"] == uninterrupted["index_version"] > max(published)

    def index_of(wh: str) -> dict:  # the manifest, less when it was built and how many commits each table took
        return {k: v for k, v in find_index(wh).items() if k != "built_at" and not k.endswith("table_version")}

    assert index_of(killed) == index_of(reference)

    def enriched(wh: str) -> list[tuple]:
        rows = read_table(tables.table_uri(wh, tables.ENRICHMENT)).to_pylist()
        assert_one_row_per_key(rows)
        return sorted((r["doc_id"], r["content_hash"], tuple(r["phrases"] or ()), r["error"]) for r in rows)

    assert enriched(killed) == enriched(reference)
    queries = ["zebrafish regenerate", "sourdough yeast", "reviewed again", "sleep obesity", "blood clot stroke"]
    killed_searcher, reference_searcher = load_searcher(killed)[0], load_searcher(reference)[0]
    for query in queries:
        assert [(h.doc_id, h.score) for h in killed_searcher.search(query, k=len(KILL_NIGHT_2))] == \
            [(h.doc_id, h.score) for h in reference_searcher.search(query, k=len(KILL_NIGHT_2))], query


def test_term_stats_rows_go_with_the_last_version_that_sums_them(tmp_path):
    """Versions 2 and 3 add their changes to version 1's whole statistics, version 4 is whole again: 1 and 2's rows
    outlive their versions while 3 sums them, and go with 3."""
    import pyarrow as pa

    from sira.pipelines.storage.delta_io import write_table

    wh = str(tmp_path / "wh")
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)

    def publish(version: int, summed: list[int], age_days: float) -> None:
        row = {f.name: None for f in tables.CORPUS_STATS_SCHEMA} | {
            "index_version": version, "preset": "sira", "enriched": False, "layout": tables.INDEX_LAYOUT,
            "built_at": now - timedelta(days=age_days), "segments": [version], "term_stats_versions": summed}
        write_table(tables.table_uri(wh, tables.CORPUS_STATS), pa.Table.from_pylist([row], tables.CORPUS_STATS_SCHEMA))
        write_table(tables.table_uri(wh, tables.TERM_STATS), pa.Table.from_pylist(
            [{"index_version": version, "term_id": version, "term": f"t{version}", "df": 1, "df_enriched": 1,
              "cf": 1}], tables.TERM_STATS_SCHEMA))

    stats_versions = lambda: sorted(set(read_table(tables.table_uri(wh, tables.TERM_STATS))[  # noqa: E731
        "index_version"].to_pylist()))
    for version, summed, age in ((1, [1], 30), (2, [1, 2], 20), (3, [1, 2, 3], 10)):
        publish(version, summed, age)
    assert expire_versions(wh, keep_days=7, now=now, vacuum=False)["expired_versions"] == [1, 2]
    assert stats_versions() == [1, 2, 3]  # version 3 sums them
    publish(4, [4], 1)
    assert expire_versions(wh, keep_days=7, now=now, vacuum=False)["expired_versions"] == [3]
    assert stats_versions() == [4]


def test_retention_keeps_the_newest_of_each_kind_and_everything_inside_the_window():
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    rows = [{"index_version": v, "preset": p, "enriched": e, "built_at": now - timedelta(days=age)}
            for v, p, e, age in [(1, "sira", False, 30), (2, "sira", True, 30), (3, "sira", False, 10),
                                 (4, "sira", True, 2), (5, "pyserini-flat", False, 40)]]
    assert expired_versions(rows, keep_days=7, now=now) == [1, 2]  # 3 is old but the newest plain sira index
    assert expired_versions(rows, keep_days=60, now=now) == []


def test_a_following_server_switches_versions_under_load_without_errors(tmp_path, spark):
    """Readers during a publish: a loaded server keeps answering while a new version is built and published, every
    answer comes whole from one version, and it switches to the new one without downtime."""
    from sira.jobs import index as index_job
    from sira.jobs import ingest as ingest_job
    from sira.pipelines.serving.serve import Limits, SearchService, build_app
    from test_serve import RunningServer, call

    wh = str(tmp_path / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=snapshot(tmp_path / "a.jsonl", TINY_DOCS), warehouse=wh))
    v1 = index_job.run(index_job.IndexConfig(warehouse=wh, shards=2), spark=spark)["index_version"]
    queries = ["heart attack risk", "zebrafish regenerate heart", "blood pressure"]
    expected = {v1: {q: [h.doc_id for h in load_searcher(wh, v1)[0].search(q, k=5)] for q in queries}}

    service = SearchService.start(wh, follow=True)
    server = RunningServer(build_app(service, Limits(max_concurrent=64), poll_s=0.2))  # follows by itself
    answers, stop = [], threading.Event()

    def load(i: int) -> None:
        while not stop.is_set():
            q = queries[i % len(queries)]
            status, body = call(server.url, "/search", {"query": q, "k": 5})
            answers.append((q, status, body.get("index_version"), [h["doc_id"] for h in body.get("hits", [])]))
            # Invalid requests mixed in: a clear 400, never a dead server.
            status, body = call(server.url, "/search", b'{"query": 3}')
            answers.append(("<invalid>", status, None, body.get("error")))

    try:
        with ThreadPoolExecutor(4) as pool:
            workers = [pool.submit(load, i) for i in range(4)]
            # Publish v2 while the load runs (a readers-during-publish check for the in-process loader too).
            old_actors = list(service.actors)
            ingest_job.run(ingest_job.IngestConfig(source=snapshot(tmp_path / "b.jsonl", NIGHT_2), warehouse=wh,
                                                   mode="merge"))
            v2 = index_job.run(index_job.IndexConfig(warehouse=wh, shards=3), spark=spark)["index_version"]
            expected[v2] = {q: [h.doc_id for h in load_searcher(wh, v2)[0].search(q, k=5)] for q in queries}
            # The poll finds the publish (a new commit of corpus_stats) and switches without being asked.
            deadline = time.monotonic() + 120
            while service.manifest["index_version"] != v2:
                assert time.monotonic() < deadline, "the server did not follow the published version"
                threading.Event().wait(0.05)
            before = len(answers)
            while len(answers) < before + 40 and not any(w.done() for w in workers):  # load the new version a while
                threading.Event().wait(0.05)
            stop.set()
            for w in workers:
                w.result()
        status, health = call(server.url, "/health")
        assert status == 200 and health["index_version"] == v2 and health["shards"] == 3 and health["switches"] == 1
        # A version with as many shards is loaded into the running actors (no process starts), which then drop v2.
        import ray

        running = list(service.actors)
        ingest_job.run(ingest_job.IngestConfig(source=snapshot(tmp_path / "c.jsonl", NIGHT_2[:-1]), warehouse=wh))
        v3 = index_job.run(index_job.IndexConfig(warehouse=wh, shards=3), spark=spark)["index_version"]
        deadline = time.monotonic() + 120
        while service.manifest["index_version"] != v3:
            assert time.monotonic() < deadline, "the server did not follow the published version"
            threading.Event().wait(0.05)
        assert service.actors == running and service.switches[-1] == {**service.switches[-1], "from": v2, "to": v3}
        status, body = call(server.url, "/search", {"query": queries[0], "k": 5})
        assert status == 200 and body["index_version"] == v3
        assert [h["doc_id"] for h in body["hits"]] == [h.doc_id for h in load_searcher(wh, v3)[0].search(queries[0], k=5)]
        while True:  # dropped once the searches on v2 have drained
            try:
                ray.get(running[0].num_docs.remote(v2), timeout=30)
            except ray.exceptions.RayTaskError:
                break
            assert time.monotonic() < deadline, "the actors kept the old version"
            threading.Event().wait(0.05)
    finally:
        stop.set()
        server.stop()
        service.stop_actors()

    valid = [a for a in answers if a[0] != "<invalid>"]
    invalid = [a for a in answers if a[0] == "<invalid>"]
    assert all(status == 200 for _, status, _, _ in valid), {a[1] for a in valid}
    assert all(status == 400 and "query" in error for _, status, _, error in invalid)
    # Every answer is exactly what its version ranks: never a mix, never a half-written index.
    assert all(hits == expected[version][q] for q, _, version, hits in valid)
    seen = [version for _, _, version, _ in valid]
    assert {v1, v2} <= set(seen) and seen.index(v2) > 0
    assert "d13" in expected[v2]["zebrafish regenerate heart"] and "d13" not in expected[v1]["zebrafish regenerate heart"]
    with pytest.raises(ray.exceptions.RayActorError):  # the old version's actors were stopped after the drain
        ray.get(old_actors[0].num_docs.remote(), timeout=30)
