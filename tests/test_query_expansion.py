"""Integration: query-side expansion through the fake OpenAI-compatible server, DF validation against the
index, retrieval programs, and the four eval variants (real Ray, Spark and Delta)."""

import json

import pytest

from sira.jobs import eval as eval_job
from sira.jobs import index as index_job
from sira.jobs import ingest as ingest_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.enrichment.ray_enrich import commit
from test_index_enrichment import enrichment_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, tiny_beir, spark):
    wh = str(tmp_path_factory.mktemp("expansion") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    commit(wh, enrichment_rows(read_table(f"{wh}/docs"), {"d09": ["espresso"]}))
    index_job.run(index_job.IndexConfig(warehouse=wh, preset="sira", shards=2, enrichment=False), spark=spark)
    return wh


def evaluate(tiny_beir, wh, fake, variant):
    backend = BackendConfig(backend="openai", model="fake-llm", base_url=fake.base_url, timeout_s=5, max_retries=1)
    return eval_job.run(eval_job.EvalConfig(dataset=str(tiny_beir), warehouse=wh, variant=variant, shards=2, tau=0.25,
                                            backend=backend))


def test_query_variant_expands_validates_and_records_programs(warehouse, tiny_beir, fake_openai, spark):
    fake_openai.answers = {"heart attack risk": ["myocardial infarction", "zebrafish", "blood"],
                           "cafe caffeine": ["espresso", "coffee"]}
    summary = evaluate(tiny_beir, warehouse, fake_openai, "query")
    assert summary["variant"] == "query" and summary["expansion"]["model"] == "fake-llm"
    programs = {p["query"]: p for p in map(json.loads, open(summary["programs_file"], encoding="utf-8"))}
    decisions = {e["phrase"]: e["reason"] for e in programs["heart attack risk"]["expansions"]}
    assert decisions == {"myocardial infarction": "kept", "zebrafish": "unseen", "blood": "too common"}
    # "espresso" exists only through the enrichment: unseen in the plain index.
    coffee = {e["phrase"]: e["reason"] for e in programs["cafe caffeine"]["expansions"]}
    assert coffee == {"espresso": "unseen", "coffee": "kept"}
    assert all(p["w"] == 0.5 for p in programs.values())

    requests = len(fake_openai.requests)
    again = evaluate(tiny_beir, warehouse, fake_openai, "query")
    assert len(fake_openai.requests) == requests and again["expansion"]["cached"] == 5  # cached by query text
    assert again["metrics"] == summary["metrics"]


def test_sira_variant_validates_against_the_enriched_index(warehouse, tiny_beir, fake_openai, spark):
    # Same answer whether it comes from the cache or the server; "espresso" now exists through the enrichment.
    fake_openai.answers = {"cafe caffeine": ["espresso", "coffee"]}
    summary = evaluate(tiny_beir, warehouse, fake_openai, "sira")
    programs = {p["query"]: p for p in map(json.loads, open(summary["programs_file"], encoding="utf-8"))}
    coffee = {e["phrase"]: e["reason"] for e in programs["cafe caffeine"]["expansions"]}
    assert coffee == {"espresso": "kept", "coffee": "kept"}
    assert set(summary["metrics"]) == {"ndcg@10", "recall@10", "recall@100"}
    # The run file names the enriched index and the query-side model: runs of two proposers do not overwrite.
    assert summary["run_file"].endswith(f"-test-sira-sira-index{summary['index_version']}-fake-llm.trec")


def test_bulk_query_job_writes_runs_and_resumes(warehouse, tiny_beir, fake_openai, tmp_path, spark):
    from sira.jobs import query as query_job
    from sira.pipelines.serving.shard_loader import load_searcher

    # A query text of its own: expansions are cached by text, and other tests expand "heart attack risk".
    fake_openai.answers = {"heart attack prevention": ["myocardial infarction"]}
    backend = BackendConfig(backend="openai", model="fake-llm", base_url=fake_openai.base_url, timeout_s=5)
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\theart attack prevention\nq3\tblood pressure\n", encoding="utf-8")
    cfg = query_job.QueryConfig(warehouse=warehouse, queries=str(queries), out=tmp_path / "bulk.trec", k=5,
                                backend=backend, tau=0.25, batch_size=1)
    first = query_job.run(cfg)
    assert (first["scored"], first["skipped"]) == (2, 0)
    runs = {r["qid"]: r for r in read_table(f"{warehouse}/runs").to_pylist()}
    program = json.loads(runs["q1"]["program"])
    assert [(e["phrase"], e["kept"]) for e in program["expansions"]] == [("myocardial infarction", True)]
    # Scatter-gather over shard actors ranks exactly like the in-process searcher running the same program.
    from sira.core.program import RetrievalProgram
    searcher, _ = load_searcher(warehouse, runs["q1"]["index_version"])
    expected = searcher.search(RetrievalProgram.model_validate(program), k=5)
    assert runs["q1"]["doc_ids"] == [h.doc_id for h in expected]
    assert runs["q1"]["scores"] == pytest.approx([h.score for h in expected])

    queries.write_text("q1\theart attack prevention\nq3\tblood pressure\nq4\tcafe caffeine\n", encoding="utf-8")
    second = query_job.run(cfg)
    assert (second["scored"], second["skipped"]) == (1, 2)
    assert sorted(r["qid"] for r in read_table(f"{warehouse}/runs").to_pylist()) == ["q1", "q3", "q4"]
    trec = (tmp_path / "bulk.trec").read_text().splitlines()
    assert {line.split()[0] for line in trec} == {"q1", "q3", "q4"} and trec[0].split()[1] == "Q0"
