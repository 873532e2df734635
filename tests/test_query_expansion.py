"""Integration: query-side expansion through the fake OpenAI-compatible server, DF validation against the
index, retrieval programs, and the four eval variants (real Ray, Spark and Delta)."""

import json

import pytest

from jobs import eval as eval_job
from jobs import ingest as ingest_job
from pipelines.delta_io import read_table
from pipelines.llm_backends import BackendConfig
from pipelines.ray_enrich import commit
from fake_openai import fake_openai, fake_openai_server  # noqa: F401 (fixtures)
from test_index_enrichment import enrichment_rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, tiny_beir, spark):
    wh = str(tmp_path_factory.mktemp("expansion") / "tiny")
    ingest_job.run(ingest_job.IngestConfig(source=str(tiny_beir), warehouse=wh))
    commit(wh, enrichment_rows(read_table(f"{wh}/docs"), {"d09": ["espresso"]}))
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
