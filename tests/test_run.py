"""`sira run`: the whole pipeline with the encoder proposer, MLflow on SQLite, stage reuse and stage failures
(real Spark, Ray, Delta and MLflow)."""

from __future__ import annotations

import json

import pytest

from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.tracking.run_plan import plan
from sira.pipelines.tracking.tracking import TrackingConfig, flatten, metric_name
from sira.core.proposers import EncoderProposerConfig

pytestmark = pytest.mark.integration


def test_metric_names_and_flattened_params():
    assert metric_name("ndcg@10") == "ndcg_at_10"
    flat = flatten({"backend": {"backend": "encoder", "encoder": {"proposals": 8}}, "variants": ["bm25", "doc"]})
    assert flat == {"backend.backend": "encoder", "backend.encoder.proposals": "8", "variants": '["bm25", "doc"]'}


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlruns")
    return TrackingConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}", experiment="tests", root=str(root))


@pytest.fixture(scope="module")
def run_cfg(tmp_path_factory, tiny_beir, tracking):
    from sira.jobs import run as run_job

    backend = BackendConfig(backend="encoder", encoder=EncoderProposerConfig(proposals=4, vocabulary_tau=0.5))
    wh = str(tmp_path_factory.mktemp("run") / "tiny")
    return run_job.RunConfig(dataset=str(tiny_beir), warehouse=wh, shards=2, tau=0.25, backend=backend,
                             tracking=tracking)


@pytest.fixture(scope="module")
def enrich_calls():
    return []


@pytest.fixture(scope="module")
def first_run(run_cfg, spark, enrich_calls):
    from sira.jobs import run as run_job
    from sira.pipelines.enrichment import corpus_enrichment

    enrich_corpus = corpus_enrichment.enrich_corpus
    with pytest.MonkeyPatch.context() as patch:  # every caller imports it when called: each call is counted
        patch.setattr(corpus_enrichment, "enrich_corpus",
                      lambda cfg, *args: enrich_calls.append(cfg) or enrich_corpus(cfg, *args))
        return run_job.run(run_cfg)


def test_plan_prices_the_twelve_layer_encoder_above_the_default(run_cfg):
    bge = run_cfg.model_copy(update={"backend": BackendConfig(backend="encoder", encoder=EncoderProposerConfig(
        proposals=4, vocabulary_tau=0.5, model="bge-small-en-v1.5"))})
    assert bge.corpus_backend.encoder.model == "bge-small-en-v1.5"
    assert plan(bge, "tiny", bge.warehouse)[1] > plan(run_cfg, "tiny", run_cfg.warehouse)[1]


def test_plan_of_an_empty_warehouse_names_every_stage(run_cfg):
    stages, seconds = plan(run_cfg, "tiny", run_cfg.warehouse)  # before first_run fills the warehouse
    assert stages[:2] == [f"ingest {run_cfg.dataset}", "index (plain)"]
    assert stages[2].startswith("enrich 12 documents (encoder)") and stages[3] == "index (enriched)"
    # No embed stage: the encoder's enrichment keeps every document's vector.
    assert stages[4:] == ["expand 5 queries (encoder)", "evaluate bm25, doc, query, sira, dense, hybrid, sira+dense"]
    assert seconds > 0


def test_run_evaluates_all_variants_and_logs_them_to_mlflow(first_run, run_cfg, tracking):
    from mlflow.tracking import MlflowClient

    assert list(first_run["variants"]) == ["bm25", "doc", "query", "sira", "dense", "hybrid", "sira+dense"]
    for variant, r in first_run["variants"].items():
        assert set(r["metrics"]) == {"ndcg@10", "recall@10", "recall@100"} and r["variant"] == variant
    assert first_run["enrichment"]["enriched"] == 12
    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    exp = client.get_experiment_by_name("tests")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_id == first_run["mlflow_run_id"]][0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["sira.variant"] for r in children) == sorted(first_run["variants"])
    assert parent.data.params["backend.backend"] == "encoder" and parent.data.params["tau"] == "0.25"
    assert parent.data.metrics["enrich.enriched"] == 12 and "enrich.docs_per_second" in parent.data.metrics
    sira = [r for r in children if r.data.tags["sira.variant"] == "sira"][0]
    assert sira.data.metrics["ndcg_at_10"] == pytest.approx(first_run["variants"]["sira"]["metrics"]["ndcg@10"])
    assert sira.data.params["variant"] == "sira" and "expansion.phrases_kept" in sira.data.metrics
    child_artifacts = {a.path for a in client.list_artifacts(sira.info.run_id)}
    assert child_artifacts == {"runs", "programs"}
    assert client.list_artifacts(sira.info.run_id, "runs")[0].path.endswith(".trec")
    parent_artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "enrichment_sample.json"} <= parent_artifacts


def test_run_asks_for_enrichment_once_for_every_variant(first_run, enrich_calls):
    assert [cfg.backend.backend for cfg in enrich_calls] == ["encoder"]  # the enrich stage's; no variant asks again
    versions = {variant: r["index_version"] for variant, r in first_run["variants"].items()}
    assert versions["doc"] == versions["sira"] == versions["sira+dense"] != versions["bm25"] == versions["query"] \
        == versions["dense"] == versions["hybrid"]
    assert first_run["stage_seconds"]["embed"] >= 0  # a stage of its own, with nothing left to embed


def test_second_run_reuses_every_stage(first_run, run_cfg, spark):
    from sira.jobs import run as run_job
    from sira.pipelines.index.catalog import published_versions

    versions = len(published_versions(run_cfg.warehouse))
    stages, _ = plan(run_cfg, "tiny", run_cfg.warehouse)
    # Nothing left to ingest, index, enrich or embed.
    assert stages == ["evaluate bm25, doc, query, sira, dense, hybrid, sira+dense"]
    again = run_job.run(run_cfg)
    assert len(published_versions(run_cfg.warehouse)) == versions  # no index rebuilt
    assert (again["enrichment"]["enriched"], again["enrichment"]["skipped"]) == (0, 12)
    assert again["variants"]["sira"]["expansion"]["cached"] == 5
    assert {v: r["metrics"] for v, r in again["variants"].items()} == \
        {v: r["metrics"] for v, r in first_run["variants"].items()}


def test_a_failing_stage_is_named(first_run, run_cfg, spark):
    from sira.jobs import run as run_job
    from sira.pipelines.tracking.stages import StageFailed

    bad = run_cfg.model_copy(update={"split": "nosuchsplit", "variants": ["bm25"],
                                     "tracking": TrackingConfig(enabled=False)})
    with pytest.raises(StageFailed, match=r"stage 'evaluate bm25' failed: .*nosuchsplit") as info:
        run_job.run(bad)
    assert info.value.stage == "evaluate bm25"


def test_cli_run_prints_the_comparison(first_run, run_cfg, tmp_path, spark):
    from typer.testing import CliRunner

    from sira.jobs.cli import app

    out = tmp_path / "run.json"
    result = CliRunner().invoke(app, ["run", "--dataset", run_cfg.dataset, "-w", run_cfg.warehouse, "--shards", "2",
                                      "--tau", "0.25", "--proposals", "4", "--variants", "bm25,query",
                                      "--no-tracking", "--output-json", str(out)])
    assert result.exit_code == 0, result.output
    assert "nDCG@10" in result.output and "query" in result.output
    assert set(json.loads(out.read_text())["variants"]) == {"bm25", "query"}


def test_report_reads_mlflow_and_plots(first_run, tracking, tmp_path):
    from sira.jobs import report as report_job

    summary = report_job.run(report_job.ReportConfig(output_dir=str(tmp_path / "report"), tracking=tracking))
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert summary["datasets"] == ["tiny"] and (tmp_path / "report" / "tiny.png").stat().st_size > 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    newest = client.search_runs([client.get_experiment_by_name("tests").experiment_id], "tags.`sira.job` = 'run'",
                                order_by=["attributes.start_time DESC"])[0]
    assert newest.info.run_id in text and "`sira run --dataset " in text  # the newest `sira run` of the dataset
    for variant, r in first_run["variants"].items():  # every run of this config has the same metrics
        assert f"| ours: {variant} | {r['metrics']['ndcg@10']:.4f} |" in text


def test_sweep_selects_on_train_and_evaluates_the_choice_once_on_test(first_run, run_cfg, tracking, spark):
    from mlflow.tracking import MlflowClient
    from pydantic import ValidationError

    from sira.jobs import sweep as sweep_job

    cfg = sweep_job.SweepConfig(dataset=run_cfg.dataset, warehouse=run_cfg.warehouse, split="train", variant="query",
                                grid={"w": [0.0, 1.0], "tau": [0.25]}, backend=run_cfg.backend, shards=2,
                                tracking=tracking)
    summary = sweep_job.run(cfg)
    train = {t["point"]["w"]: t["metrics"]["ndcg@10"] for t in summary["tried"]}
    assert set(train) == {0.0, 1.0}
    assert summary["selected"]["w"] == max(train, key=lambda w: (train[w], -w))  # best on train, ties to the first
    assert set(summary["test"]["metrics"]) == {"ndcg@10", "recall@10", "recall@100"}
    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    children = client.search_runs([client.get_experiment_by_name("tests").experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{summary['mlflow_run_id']}'")
    assert sorted(c.data.tags["sira.split"] for c in children) == ["test", "train", "train"]
    with pytest.raises(ValidationError):
        sweep_job.SweepConfig(dataset=run_cfg.dataset, split="test", grid={"w": [0.5]})
    with pytest.raises(ValidationError, match="cannot sweep"):
        sweep_job.SweepConfig(dataset=run_cfg.dataset, split="dev", grid={"k1": [1.2]})


def test_walkthrough_notebook_executes(first_run, run_cfg, monkeypatch, spark):
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("SIRA_NOTEBOOK_DATASET", run_cfg.dataset)
    monkeypatch.setenv("SIRA_NOTEBOOK_WAREHOUSE", run_cfg.warehouse)
    monkeypatch.setenv("SIRA_NOTEBOOK_QUERY", "heart attack risk")
    monkeypatch.setenv("SIRA_NOTEBOOK_SHARDS", "2")
    monkeypatch.setenv("SIRA_NOTEBOOK_TAU", "0.25")
    monkeypatch.setenv("PYTHONPATH", str(root))
    nb = nbformat.read(root / "notebooks" / "scifact_walkthrough.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in outputs)
    assert "d01" in text and "ndcg@10" in text
