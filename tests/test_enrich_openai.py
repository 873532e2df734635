"""`sira enrich --backend openai` end to end: real local Ray, real Delta tables, a real loopback HTTP server
(tests/fake_openai.py) that answers well, fails, stalls or talks nonsense on demand."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conftest import TINY_DOCS, kill_when, start_job
from fake_openai import POISON_MARKER, FakeOpenAI, document_of, keywords_for
from sira.jobs import enrich as enrich_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.storage.delta_io import read_table, table_version
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.core import tables
from sira.core.enrichment import JSON_SCHEMA, document_input, load_template

pytestmark = pytest.mark.integration

MODEL = "fake-model"
SUMMARY_KEYS = {"documents", "enriched", "skipped", "errors", "input_tokens", "output_tokens", "seconds"}
DOC_INPUTS = {d["_id"]: document_input(d["title"], d["text"]) for d in TINY_DOCS}


@pytest.fixture(scope="session", autouse=True)
def local_ray():
    """One local Ray for the session (the job's init_ray is idempotent, so every run reuses it)."""
    from sira.pipelines.enrichment.ray_enrich import init_ray

    init_ray()
    yield
    import ray

    ray.shutdown()


def make_warehouse(root: Path, docs=TINY_DOCS) -> str:
    root.mkdir(parents=True, exist_ok=True)
    source = root / "corpus.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    warehouse = str(root / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=warehouse))
    return warehouse


def run_enrich(warehouse: str, server: FakeOpenAI, limit: int | None = None, retry_errors: bool = True,
               **backend) -> dict:
    settings = {"timeout_s": 5.0, "max_retries": 2, "retry_base_s": 0.01, "batch_size": 4, **backend}
    cfg = enrich_job.EnrichConfig(
        warehouse=warehouse, commit_every=5, limit=limit, retry_errors=retry_errors,
        backend=BackendConfig(backend="openai", model=MODEL, base_url=server.base_url, **settings),
    )
    return enrich_job.run(cfg)


def enrichment_rows(warehouse: str) -> list[dict]:
    return read_table(tables.table_uri(warehouse, tables.ENRICHMENT)).to_pylist()


def assert_one_row_per_key(rows: list[dict]) -> None:
    keys = Counter(tuple(r[k] for k in tables.ENRICHMENT_KEY) for r in rows)
    assert all(n == 1 for n in keys.values()), [k for k, n in keys.items() if n > 1]


def test_happy_path_enriches_every_doc_with_parsed_phrases_and_token_counts(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    summary = run_enrich(wh, fake_openai)

    assert SUMMARY_KEYS <= summary.keys() and json.loads(json.dumps(summary))["documents"] == len(TINY_DOCS)
    assert (summary["documents"], summary["enriched"], summary["skipped"], summary["errors"]) == (12, 12, 0, 0)
    assert summary["seconds"] > 0
    requests = fake_openai.requests
    assert len(requests) == len(TINY_DOCS)  # no retries when the server is healthy
    assert summary["input_tokens"] == sum(len(r.prompt.split()) for r in requests)
    assert summary["output_tokens"] == sum(
        len(json.dumps({"keywords": keywords_for(document_of(r.prompt))}).split()) for r in requests)

    body = requests[0].body
    assert (body["model"], body["temperature"], body["seed"]) == (MODEL, 0.4, 42)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == JSON_SCHEMA
    ends_with = [d for r in requests for d in DOC_INPUTS.values() if r.prompt.rstrip().endswith(d)]
    assert sorted(ends_with) == sorted(DOC_INPUTS.values())  # each prompt ends with its document (prefix caching)

    rows = enrichment_rows(wh)
    assert sorted(r["doc_id"] for r in rows) == sorted(DOC_INPUTS)
    version = load_template("doc", "generic").version
    for r in rows:
        assert (r["model"], r["prompt_version"], r["backend"], r["error"]) == (MODEL, version, "openai", None)
        assert r["phrases"] == keywords_for(DOC_INPUTS[r["doc_id"]])
        assert json.loads(r["raw_output"]) == {"keywords": r["phrases"]}
        assert r["input_tokens"] > 0 and r["output_tokens"] > 0 and r["latency_ms"] > 0
    assert_one_row_per_key(rows)


def test_rerun_is_incremental_and_a_changed_doc_is_enriched_again(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    run_enrich(wh, fake_openai)
    uri = tables.table_uri(wh, tables.ENRICHMENT)
    version = table_version(uri)

    fake_openai.reset("ok")
    again = run_enrich(wh, fake_openai)
    assert (again["documents"], again["enriched"], again["skipped"], again["errors"]) == (12, 0, 12, 0)
    assert fake_openai.requests == [] and table_version(uri) == version

    changed = [dict(d, text=d["text"] + " Also known as cardiac arrest.") if d["_id"] == "d03" else d
               for d in TINY_DOCS]
    make_warehouse(tmp_path, changed)  # re-ingest: a new snapshot of docs, d03 with a new content hash
    third = run_enrich(wh, fake_openai)
    assert (third["documents"], third["enriched"], third["skipped"], third["errors"]) == (12, 1, 11, 0)
    assert [document_of(r.prompt).rstrip() for r in fake_openai.requests] == [
        document_input("Stroke", changed[2]["text"])]
    rows = enrichment_rows(wh)
    assert len(rows) == 13 and Counter(r["doc_id"] for r in rows)["d03"] == 2  # the old version's row stays
    assert_one_row_per_key(rows)


def test_http_500_becomes_an_error_row_per_doc_and_the_job_finishes(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    fake_openai.reset("http500")
    summary = run_enrich(wh, fake_openai, max_retries=2)

    assert (summary["documents"], summary["enriched"], summary["errors"]) == (12, 0, 12)
    assert set(fake_openai.attempts_by_document().values()) == {3}
    rows = enrichment_rows(wh)
    assert len(rows) == 12
    assert {r["error"] for r in rows} == {"HTTP 500 (after 3 attempts)"}
    assert all(r["phrases"] == [] and r["raw_output"] is None for r in rows)


def test_flaky_server_is_retried_and_every_doc_succeeds(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    fake_openai.reset("flaky")
    summary = run_enrich(wh, fake_openai, max_retries=2)

    assert (summary["enriched"], summary["errors"]) == (12, 0)
    assert set(fake_openai.attempts_by_document().values()) == {2}
    assert [r.status for r in fake_openai.requests].count(500) == 12
    assert all(r["error"] is None and r["phrases"] for r in enrichment_rows(wh))


def test_timeout_becomes_an_error_row(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    fake_openai.reset("slow")
    summary = run_enrich(wh, fake_openai, limit=2, timeout_s=0.5, max_retries=1)

    assert (summary["documents"], summary["enriched"], summary["errors"]) == (12, 0, 2)
    assert set(fake_openai.attempts_by_document().values()) == {2}
    rows = enrichment_rows(wh)
    assert sorted(r["doc_id"] for r in rows) == ["d01", "d02"]
    assert {r["error"] for r in rows} == {"timeout after 0.5 s (after 2 attempts)"}


@pytest.mark.parametrize(
    ("mode", "error_prefix", "keeps_raw_output"),
    [("junk", "no JSON found in output", True), ("not_json", "HTTP 200: response is not JSON", False)],
)
def test_unusable_answers_become_error_rows(tmp_path, fake_openai, mode, error_prefix, keeps_raw_output):
    wh = make_warehouse(tmp_path)
    fake_openai.reset(mode)
    summary = run_enrich(wh, fake_openai)

    assert (summary["enriched"], summary["errors"]) == (0, 12)
    assert len(fake_openai.requests) == 12  # a 200 is an answer: nothing to retry
    rows = enrichment_rows(wh)
    assert all(r["error"].startswith(error_prefix) and r["phrases"] == [] for r in rows)
    if keeps_raw_output:
        assert all(r["raw_output"].startswith("Sure! Here are some keywords") for r in rows)
        assert summary["input_tokens"] > 0  # the call was paid for even though its answer is unusable
    else:
        assert all(r["raw_output"] is None for r in rows)


def test_poison_doc_errors_alone_and_a_later_rerun_retries_just_that_doc(tmp_path, fake_openai):
    docs = [dict(d, text=d["text"] + " " + POISON_MARKER) if d["_id"] == "d05" else d for d in TINY_DOCS]
    wh = make_warehouse(tmp_path, docs)
    fake_openai.reset("poison")
    first = run_enrich(wh, fake_openai, max_retries=1)

    assert (first["enriched"], first["errors"]) == (11, 1)
    errors = {r["doc_id"]: r["error"] for r in enrichment_rows(wh) if r["error"]}
    assert errors == {"d05": "HTTP 500 (after 2 attempts)"}

    fake_openai.reset("ok")
    kept = run_enrich(wh, fake_openai, retry_errors=False)  # --keep-errors: the error row stays, nothing is asked
    assert (kept["documents"], kept["enriched"], kept["skipped"], kept["errors"]) == (12, 0, 12, 0)
    assert fake_openai.requests == [] and sum(bool(r["error"]) for r in enrichment_rows(wh)) == 1
    second = run_enrich(wh, fake_openai)
    assert (second["documents"], second["enriched"], second["skipped"], second["errors"]) == (12, 1, 11, 0)
    assert [POISON_MARKER in r.prompt for r in fake_openai.requests] == [True]
    rows = enrichment_rows(wh)
    assert len(rows) == 12 and all(r["error"] is None for r in rows)  # the error row was replaced, not duplicated
    assert_one_row_per_key(rows)


def test_killed_job_keeps_its_commits_and_a_rerun_completes_without_duplicates(tmp_path, fake_openai):
    docs = [{"_id": f"r{i:02d}", "title": f"Topic {i}", "text": f"Document number {i} about subject {i % 7}."}
            for i in range(30)]
    wh = make_warehouse(tmp_path, docs)
    uri = tables.table_uri(wh, tables.ENRICHMENT)
    # One request at a time, 0.3 s each: the job needs 9 s for the 30 documents, far longer than the kill takes
    # after its first commit, even on a loaded machine (with the adaptive window all 30 were answered at once).
    fake_openai.reset("ok", delay_s=0.3)
    log = tmp_path / "killed.log"
    proc = start_job(["enrich", "--warehouse", wh, "--backend", "openai", "--base-url", fake_openai.base_url,
                      "--model", MODEL, "--batch-size", "4", "--commit-every", "4", "--max-in-flight", "1"], log)
    kill_when(proc, log, lambda: table_version(uri) is not None, timeout_s=240)  # after its first commit
    committed = {r["doc_id"] for r in enrichment_rows(wh)}
    assert 0 < len(committed) < len(docs), "the job was not killed part-way"

    fake_openai.reset("ok")
    summary = run_enrich(wh, fake_openai)
    assert (summary["documents"], summary["skipped"], summary["errors"]) == (30, len(committed), 0)
    assert summary["enriched"] == len(docs) - len(committed)
    missing = {document_input(d["title"], d["text"]) for d in docs if d["_id"] not in committed}
    assert {document_of(r.prompt).rstrip() for r in fake_openai.requests} == missing  # committed docs are not redone

    rows = enrichment_rows(wh)
    assert_one_row_per_key(rows)
    assert sorted(r["doc_id"] for r in rows) == [d["_id"] for d in docs]
    assert all(r["error"] is None for r in rows)


# ---------------------------------------------------------------- requests in flight ------------------------------


def test_many_requests_are_in_flight_at_once_and_never_more_than_the_bound(tmp_path, fake_openai):
    docs = [{"_id": f"c{i:02d}", "title": f"Topic {i}", "text": f"Document number {i} about subject {i % 7}."}
            for i in range(40)]
    wh = make_warehouse(tmp_path, docs)
    fake_openai.reset("ok", delay_s=0.5)  # answers overlap only if the client sends before the last one returns
    summary = run_enrich(wh, fake_openai, batch_size=4, max_in_flight=10)

    assert (summary["enriched"], summary["errors"]) == (40, 0)
    assert fake_openai.max_concurrent == 10  # across batches: 10 is no multiple of the batch size


def test_a_server_that_answers_close_to_the_timeout_gets_fewer_requests_at_once_down_to_one(tmp_path, fake_openai):
    docs = [{"_id": f"q{i:02d}", "title": f"Topic {i}", "text": f"Document number {i} about subject {i % 7}."}
            for i in range(20)]
    wh = make_warehouse(tmp_path, docs)
    # Over half the timeout (the server's queue is about to time requests out), with over a second to spare.
    fake_openai.reset("ok", delay_s=1.3)
    summary = run_enrich(wh, fake_openai, timeout_s=2.4, batch_size=8, max_in_flight=8)

    at_arrival = [r.concurrent for r in fake_openai.requests]  # requests in flight as each one arrived
    assert (summary["enriched"], summary["errors"]) == (20, 0), at_arrival  # nothing timed out
    assert max(at_arrival) > 4, at_arrival  # the first round: up to the window's start, as rows reach the actor
    assert at_arrival[-4:] == [1, 1, 1, 1], at_arrival  # halved round by round (8, 4, 2, 1), then one at a time


# ---------------------------------------------------------------- commits -----------------------------------------


def operations(warehouse: str) -> list[str]:
    """The enrichment table's commits, oldest first: WRITE (an append), MERGE, OPTIMIZE (a compaction)."""
    from deltalake import DeltaTable

    return [h["operation"] for h in reversed(DeltaTable(tables.table_uri(warehouse, tables.ENRICHMENT)).history())]


def test_new_keys_are_appended_and_only_retries_of_errors_are_merged(tmp_path, fake_openai):
    docs = [dict(d, text=d["text"] + " " + POISON_MARKER) if d["_id"] == "d05" else d for d in TINY_DOCS]
    wh = make_warehouse(tmp_path, docs)
    fake_openai.reset("poison")
    first = run_enrich(wh, fake_openai, max_retries=0)
    assert (first["enriched"], first["errors"], first["commits"]) == (11, 1, 3)  # 12 rows, 5 per commit
    assert operations(wh) == ["WRITE", "WRITE", "WRITE", "OPTIMIZE"]  # no MERGE: every key was new

    more = [*docs, {"_id": "d13", "title": "Kidneys", "text": "Kidneys filter the blood."}]
    make_warehouse(tmp_path, more)
    fake_openai.reset("ok")
    second = run_enrich(wh, fake_openai)
    assert (second["documents"], second["enriched"], second["skipped"], second["errors"]) == (13, 2, 11, 0)
    # One chunk: d05 replaces its error through a MERGE, d13 is appended.
    assert operations(wh)[4:] == ["WRITE", "MERGE", "OPTIMIZE"]
    rows = enrichment_rows(wh)
    assert_one_row_per_key(rows)
    assert sorted(r["doc_id"] for r in rows) == sorted(d["_id"] for d in more)
    assert all(r["error"] is None and r["phrases"] for r in rows)


def test_a_job_compacts_its_small_files_as_it_goes_and_ends_with_a_checkpoint(tmp_path, fake_openai, monkeypatch):
    from deltalake import DeltaTable

    from sira.pipelines.enrichment import ray_enrich

    monkeypatch.setattr(ray_enrich, "COMPACT_EVERY_COMMITS", 2)
    wh = make_warehouse(tmp_path)
    summary = enrich_job.run(enrich_job.EnrichConfig(
        warehouse=wh, commit_every=3,
        backend=BackendConfig(backend="openai", model=MODEL, base_url=fake_openai.base_url, batch_size=3)))

    assert (summary["enriched"], summary["commits"]) == (12, 4)
    assert operations(wh) == ["WRITE", "WRITE", "OPTIMIZE", "WRITE", "WRITE", "OPTIMIZE"]  # the last one at the end
    uri = tables.table_uri(wh, tables.ENRICHMENT)
    last = json.loads((Path(uri) / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == DeltaTable(uri).version() == 5  # a reader starts from the checkpoint, no log replay
    assert len(DeltaTable(uri).file_uris()) == 1
    assert_one_row_per_key(enrichment_rows(wh))


def test_a_slow_backend_commits_every_commit_interval_before_commit_every_rows(tmp_path, fake_openai):
    wh = make_warehouse(tmp_path)
    fake_openai.reset("ok", delay_s=0.5)  # one batch of 4 at a time: answers arrive every half second
    summary = enrich_job.run(enrich_job.EnrichConfig(
        warehouse=wh, commit_every=1000, commit_interval_s=0.1,
        backend=BackendConfig(backend="openai", model=MODEL, base_url=fake_openai.base_url, batch_size=4,
                              max_in_flight=4)))

    assert summary["enriched"] == 12
    assert 2 <= summary["commits"] <= 3  # one commit of 12 rows without the interval; at most one per batch
    assert_one_row_per_key(enrichment_rows(wh))


def test_once_another_writer_has_committed_every_later_chunk_is_merged(tmp_path):
    """The append path trusts which keys were new when the job began; a commit by someone else (an import, another
    job) makes that stale for the rest of the job, so the writer MERGEs from then on and no key lands twice."""
    from datetime import datetime, timezone

    import pyarrow as pa

    from sira.pipelines.enrichment.ray_enrich import REPLACES_ERROR, ProposalWriter, commit

    def rows(doc_ids: list[str]) -> pa.Table:
        return pa.Table.from_pylist([
            {"doc_id": d, "content_hash": "h", "model": MODEL, "prompt_version": "v", "backend": "openai",
             "phrases": ["alt"], "weights": None, "raw_output": None, "input_tokens": 0, "output_tokens": 0,
             "latency_ms": 0.0, "error": None, "enriched_at": datetime.now(timezone.utc), REPLACES_ERROR: False}
            for d in doc_ids])  # all marked new, as when the job began

    wh = str(tmp_path / "wh")
    writer = ProposalWriter(wh, tables.ENRICHMENT)
    assert writer.write(rows(["a", "b"]))["appended"] == 2
    commit(wh, rows(["c", "f"]).drop_columns([REPLACES_ERROR]))  # another writer: keys of this job's next chunks
    for chunk in (["c", "d"], ["e", "f"]):
        stats = writer.write(rows(chunk))
        assert (stats["appended"], stats["merged"]) == (0, 2)
    writer.close()
    rows_now = enrichment_rows(wh)
    assert_one_row_per_key(rows_now)
    assert sorted(r["doc_id"] for r in rows_now) == ["a", "b", "c", "d", "e", "f"]
