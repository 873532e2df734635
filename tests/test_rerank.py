"""The sira+rerank variant: the relevance prompt and parser, the merge rule, judgments through the fake
OpenAI-compatible server (cached in Delta, failures keeping their first-stage slots), `sira run` / `sira eval`
opting in, and the embedded local model judging real pairs."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from conftest import TINY_DOCS, require_local_model
from sira.jobs import ingest as ingest_job
from sira.jobs import run as run_job
from sira.pipelines.storage.delta_io import read_table
from sira.pipelines.enrichment.rerank import RerankConfig, judge_backend, rerank_run
from sira.core import tables
from sira.core.enrichment import document_input
from sira.core.rerank import load_rerank_template, parse_score, render_judgment, rerank_order
from sira.core.variants import SINGLE_CALL_VARIANTS

JUDGE = "fake-judge"


# ---------------------------------------------------------------- prompt, parser, merge rule ----------------------


@pytest.mark.parametrize("raw, expected", [
    ('{"score": 73}', 73),
    ('```json\n{"score": 0}\n```', 0),
    ('Here you go: {"score": 100} (very relevant)', 100),
    ('{"relevance": 72.6}', 73),  # another key models use; rounded
    ('{"score": "88"}', 88),
    (" 42\n", 42),  # a bare number
])
def test_parse_score_accepts(raw, expected):
    assert parse_score(raw) == (expected, None)


@pytest.mark.parametrize("raw, error", [
    (None, "empty output"),
    ("   ", "empty output"),
    ("I think it is relevant.", "no JSON found"),
    ('{"score": 105}', "outside 0..100"),  # rejected, not clamped
    ("-3", "outside 0..100"),
    ('{"score": true}', "not a number"),
    ('{"score": null}', "not a number"),
    ('{"score": NaN}', "not a number"),
    ('{"score": "high"}', "not a number"),
    ("[73]", "not a number"),
    ('{"keywords": ["heart"]}', "JSON has no score"),
    ("[" * 100_000, None),  # nested too deeply for the JSON decoder: an error either way, never an exception
])
def test_parse_score_rejects(raw, error):
    score, problem = parse_score(raw)
    assert score is None and problem
    assert error is None or error in problem


def test_template_is_versioned_and_renders_in_one_pass():
    template = load_rerank_template()
    assert template.version.startswith("rerank-generic-")
    prompt = render_judgment(template, "what is {passage}?", "Aspirin {query} thins blood.")
    assert prompt.endswith("Query:\nwhat is {passage}?\n\nPassage:\nAspirin {query} thins blood.\n")
    assert '{"score":' in prompt and "{query}" not in template.text.split("Query:")[0]


def test_rerank_order_reorders_the_block_and_keeps_failed_slots():
    first = ["a", "b", "c", "d", "e", "f", "g"]
    # c and a judged high, b failed (None) and g unjudged below the block.
    assert rerank_order(first, {"a": 10, "b": None, "c": 90, "d": 10, "e": 50}, depth=5) == \
        ["c", "b", "e", "a", "d", "f", "g"]  # b keeps slot 2; ties (a, d) in first-stage order; f, g untouched
    assert rerank_order(first, {}, depth=5) == first  # every judgment failed: the first-stage ranking
    assert rerank_order(first[:3], {"c": 5, "b": 7, "a": 1}, depth=20) == ["b", "c", "a"]  # fewer hits than depth


def test_encoder_and_vllm_cannot_rerank():
    with pytest.raises(ValidationError, match="encoder backend cannot rerank.*--rerank-backend local or openai"):
        RerankConfig(backend=judge_backend("encoder"))
    with pytest.raises(ValidationError, match="vllm serve MODEL.*--rerank-backend openai"):
        RerankConfig(backend=judge_backend("vllm", "Qwen/Qwen3-8B"))
    assert judge_backend("openai", JUDGE).temperature == 0.0  # the reference judges at temperature 0


def test_sira_run_does_not_rerank_unless_asked(tiny_beir):
    from sira.jobs import eval as eval_job

    assert "sira+rerank" not in run_job.RunConfig().variants
    assert SINGLE_CALL_VARIANTS == ("bm25", "doc", "query", "sira")
    with pytest.raises(ValidationError, match="needs a reranker: --rerank-backend"):
        run_job.RunConfig(variants=["bm25", "sira+rerank"])
    with pytest.raises(ValidationError, match="add it to --variants"):
        run_job.RunConfig(rerank=RerankConfig(backend=judge_backend("openai", JUDGE)))
    with pytest.raises(ValidationError, match="needs a reranker"):
        eval_job.EvalConfig(dataset=str(tiny_beir), variant="sira+rerank")
    with pytest.raises(ValidationError, match="apply only to variant sira\\+rerank"):
        eval_job.EvalConfig(dataset=str(tiny_beir), variant="sira",
                            rerank=RerankConfig(backend=judge_backend("openai", JUDGE)))
    opted_in = run_job.RunConfig(variants=["bm25", "sira+rerank"], rerank=RerankConfig(
        backend=judge_backend("openai", JUDGE), depth=5))
    assert opted_in.enriched and "--rerank-backend openai --rerank-model fake-judge --rerank-depth 5" in \
        opted_in.command()


# ---------------------------------------------------------------- judgments through the fake server --------------

DOC_ORDER = ["d03", "d04", "d01", "d05", "d02", "d06", "d07", "d08"]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    source = root / "corpus.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in TINY_DOCS), encoding="utf-8")
    wh = str(root / "wh")
    ingest_job.run(ingest_job.IngestConfig(source=str(source), warehouse=wh))
    return wh


def first_stage(doc_ids):
    """A first-stage run for one query: descending scores in the given order."""
    return {d: float(100 - i) for i, d in enumerate(doc_ids)}


def reranker(fake, depth=5, **backend) -> RerankConfig:
    settings = {"timeout_s": 5.0, "max_retries": 1, "retry_base_s": 0.01, "batch_size": 4, **backend}
    return RerankConfig(backend=judge_backend("openai", JUDGE, fake.base_url, **settings), depth=depth)


def order(run: dict[str, float]) -> list[str]:
    return sorted(run, key=lambda d: -run[d])


@pytest.mark.integration
def test_top_k_is_reordered_by_the_judged_scores_and_cached(warehouse, fake_openai):
    fake_openai.reset("rerank")
    fake_openai.rerank_scores = {"heart": 90, "insulin": 50}  # every other passage scores 10
    queries = {"q1": "heart attack risk"}
    run, summary = rerank_run(warehouse, queries, {"q1": first_stage(DOC_ORDER)}, reranker(fake_openai))
    # Block d03 (10) d04 (insulin 50) d01 (heart 90) d05 (insulin 50) d02 (heart 90); d06-d08 stay below it in
    # first-stage order although d06 and d07 mention the heart.
    assert order(run["q1"]) == ["d01", "d02", "d04", "d05", "d03", "d06", "d07", "d08"]
    assert sorted(run["q1"].values()) == [float(s) for s in range(1, 9)]  # rank-derived scores
    assert (summary["judged"], summary["errors"], summary["cached"]) == (5, 0, 0)
    assert summary["input_tokens"] > 0 and summary["output_tokens"] > 0 and summary["judgments_per_second"] > 0
    assert len(fake_openai.requests) == 5
    body = fake_openai.requests[0].body
    assert body["model"] == JUDGE and body["temperature"] == 0.0
    assert body["response_format"]["json_schema"]["name"] == "relevance"

    judgments = {r["doc_id"]: r for r in read_table(f"{warehouse}/{tables.RERANK}").to_pylist()}
    assert {d: judgments[d]["score"] for d in DOC_ORDER[:5]} == {"d03": 10, "d04": 50, "d01": 90, "d05": 50, "d02": 90}
    assert judgments["d01"]["prompt_version"] == load_rerank_template().version and judgments["d01"]["error"] is None

    # A second run pays nothing: every judgment comes from the Delta cache, the ranking is the same.
    fake_openai.reset("rerank")
    again, summary = rerank_run(warehouse, queries, {"q1": first_stage(DOC_ORDER)}, reranker(fake_openai))
    assert fake_openai.requests == [] and (summary["judged"], summary["cached"]) == (0, 5)
    assert again == run


@pytest.mark.integration
def test_failed_judgments_keep_their_first_stage_slots_and_are_retried(warehouse, fake_openai):
    fake_openai.reset("rerank")
    fake_openai.rerank_scores = {"blood": None, "heart": 90}  # passages about blood get a prose answer
    queries = {"q7": "stroke prevention"}
    hits = {"q7": first_stage(["d03", "d04", "d01", "d10", "d12", "d02"])}
    run, summary = rerank_run(warehouse, queries, hits, reranker(fake_openai))
    # d03, d10 and d12 (blood) failed and stay in slots 1, 4 and 5; d01 (90) and d04 (10) fill slots 2 and 3.
    assert order(run["q7"]) == ["d03", "d01", "d04", "d10", "d12", "d02"]
    assert (summary["judged"], summary["errors"]) == (2, 3)
    errors = {r["doc_id"]: r["error"] for r in read_table(f"{warehouse}/{tables.RERANK}").to_pylist()
              if r["query"] == "stroke prevention" and r["error"]}
    assert set(errors) == {"d03", "d10", "d12"} and all("no JSON found" in e for e in errors.values())

    # The next run asks again for exactly the failed judgments.
    fake_openai.reset("rerank")
    fake_openai.rerank_scores = {"blood": 70, "heart": 90}
    run, summary = rerank_run(warehouse, queries, hits, reranker(fake_openai))
    assert len(fake_openai.requests) == 3 and (summary["judged"], summary["cached"], summary["errors"]) == (3, 2, 0)
    assert order(run["q7"]) == ["d01", "d03", "d10", "d12", "d04", "d02"]


@pytest.mark.integration
def test_an_unreachable_judge_leaves_the_first_stage_ranking(warehouse, fake_openai):
    fake_openai.reset("http500")
    doc_ids = ["d05", "d12", "d04", "d08"]
    run, summary = rerank_run(warehouse, {"q2": "insulin and blood glucose"}, {"q2": first_stage(doc_ids)},
                              reranker(fake_openai, depth=3, max_retries=0))
    assert order(run["q2"]) == doc_ids and (summary["judged"], summary["errors"]) == (0, 3)


# ---------------------------------------------------------------- sira run / sira eval opting in -----------------


@pytest.mark.integration
def test_sira_run_opts_in_logs_the_cost_and_labels_it_not_single_call(tmp_path, tiny_beir, fake_openai, spark):
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from sira.jobs.cli import app
    from sira.pipelines.enrichment.backend_config import BackendConfig
    from sira.pipelines.tracking.tracking import TrackingConfig

    fake_openai.reset("rerank")
    fake_openai.rerank_scores = {"heart": 90}
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="rerank",
                              root=str(tmp_path / "mlruns"))
    backend = BackendConfig(backend="openai", model="fake-llm", base_url=fake_openai.base_url, timeout_s=5)
    cfg = run_job.RunConfig(dataset=str(tiny_beir), warehouse=str(tmp_path / "tiny"), shards=2, tau=0.25,
                            variants=["bm25", "sira+rerank"], backend=backend, rerank=reranker(fake_openai),
                            tracking=tracking)
    summary = run_job.run(cfg)

    assert list(summary["variants"]) == ["bm25", "sira+rerank"]
    reranked = summary["variants"]["sira+rerank"]
    assert reranked["rerank"]["judged"] > 0 and reranked["rerank"]["depth"] == 5
    trec = [line.split() for line in open(reranked["run_file"], encoding="utf-8")]
    q1 = [doc for qid, _, doc, *_ in trec if qid == "q1"]
    heart = {d["_id"] for d in TINY_DOCS if "heart" in document_input(d["title"], d["text"]).lower()}
    top = [d in heart for d in q1[:5]]
    assert top == sorted(top, reverse=True) and any(top)  # the judged block: heart passages first
    report = (tmp_path / "tiny" / "run-tiny-test.md").read_text(encoding="utf-8")
    assert "| sira+rerank (not single-call: LLM rerank of the top 5) |" in report

    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    children = client.search_runs([client.get_experiment_by_name("rerank").experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{summary['mlflow_run_id']}'")
    child = next(r for r in children if r.data.tags["sira.variant"] == "sira+rerank")
    assert child.data.metrics["rerank.judged"] == reranked["rerank"]["judged"]
    assert {"rerank.input_tokens", "rerank.output_tokens", "rerank.seconds"} <= set(child.data.metrics)
    assert child.data.params["rerank.depth"] == "5"

    # `sira eval` on the same warehouse: index, expansions and judgments all reused; not one request.
    fake_openai.reset("rerank")
    out = tmp_path / "eval.json"
    result = CliRunner().invoke(app, [
        "eval", "--dataset", str(tiny_beir), "-w", cfg.warehouse, "--shards", "2", "--tau", "0.25",
        "--variant", "sira+rerank", "--backend", "openai", "--model", "fake-llm", "--base-url", fake_openai.base_url,
        "--rerank-backend", "openai", "--rerank-model", JUDGE, "--rerank-depth", "5", "--output-json", str(out)])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(out.read_text())
    assert fake_openai.requests == [] and evaluated["rerank"]["judged"] == 0 and evaluated["rerank"]["cached"] > 0
    assert evaluated["metrics"] == reranked["metrics"]

    refused = CliRunner().invoke(app, ["run", "--dataset", str(tiny_beir), "--variants", "bm25,sira+rerank",
                                       "--no-tracking"])
    assert isinstance(refused.exception, ValidationError) and "--rerank-backend" in str(refused.exception)


# ---------------------------------------------------------------- the embedded local model -----------------------


@pytest.mark.integration
def test_local_model_judges_real_pairs(warehouse):
    from sira.pipelines.enrichment import local_llm

    require_local_model()
    # Three judgments: the query's passage, an off-topic one, and a related one.
    hits = {"q1": first_stage(["d09", "d01", "d06"])}
    run, summary = rerank_run(warehouse, {"q1": "heart attack risk"}, hits,
                              RerankConfig(backend=judge_backend("local"), depth=3))
    assert (summary["judged"], summary["errors"]) == (3, 0), summary  # the grammar makes every answer parse
    rows = [r for r in read_table(f"{warehouse}/{tables.RERANK}").to_pylist() if r["backend"] == "local"]
    assert len(rows) == 3 and all(0 <= r["score"] <= 100 and r["output_tokens"] > 0 for r in rows)
    assert rows[0]["model"] == local_llm.DEFAULT_LOCAL_MODEL
    assert sorted(run["q1"]) == ["d01", "d06", "d09"]
