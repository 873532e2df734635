"""The `sira` command line, in process (sharing the session's Spark) and as a real subprocess."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sira.jobs.cli import app
from conftest import TINY_DOCS, write_beir_folder

pytestmark = pytest.mark.integration
runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_ingest_index_search_explain_json(tmp_path, tiny_beir, spark):
    wh = tmp_path / "wh"
    invoke("ingest", tiny_beir, "--warehouse", wh, "--output-json", tmp_path / "ingest.json")
    assert json.loads((tmp_path / "ingest.json").read_text())["kept"] == len(TINY_DOCS)
    invoke("index", "--warehouse", wh, "--preset", "pyserini-flat", "--shards", 2, "--output-json", tmp_path / "i.json")
    assert json.loads((tmp_path / "i.json").read_text())["num_shards"] == 2

    out = json.loads(invoke("search", "heart attack", "-w", wh, "-k", 3, "--explain", "--json").stdout)
    assert out["terms"] == ["heart", "attack"]
    assert [h["rank"] for h in out["hits"]] == [1, 2, 3]
    assert out["hits"][0]["doc_id"] == "d01"
    assert all(abs(sum(h["contributions"].values()) - h["score"]) < 1e-3 for h in out["hits"])
    table = invoke("search", "heart attack", "-w", wh, "--explain").stdout
    assert "d01" in table and "heart=" in table


def test_eval_builds_what_is_missing_and_writes_the_json_contract(tmp_path, tiny_beir, spark):
    out = tmp_path / "eval.json"
    invoke("eval", "--dataset", tiny_beir, "--preset", "sira", "-w", tmp_path / "wh", "--output-json", out)
    summary = json.loads(out.read_text())
    assert {"dataset", "split", "preset", "variant", "num_queries", "metrics"} <= summary.keys()
    assert (summary["dataset"], summary["split"], summary["preset"], summary["variant"]) == ("tiny", "test", "sira", "bm25")
    assert summary["num_queries"] == 5
    assert set(summary["metrics"]) == {"ndcg@10", "recall@10", "recall@100"}
    assert 0 < summary["metrics"]["ndcg@10"] <= 1
    # Query q5 has no matching term: it counts as 0, it is not dropped from the mean.
    assert summary["metrics"]["recall@100"] == pytest.approx(4 / 5)
    first_run = (tmp_path / "wh" / "runs").glob("*.trec")
    assert next(first_run).read_text().split("\n")[0].split()[1] == "Q0"


def test_datasets_whose_queries_are_documents_drop_the_query_itself(tmp_path, spark):
    docs = [{"_id": "a1", "title": "", "text": "school uniforms restrict freedom"},
            {"_id": "a2", "title": "", "text": "school uniforms create equality"},
            {"_id": "a3", "title": "", "text": "unrelated text about taxes"}]
    folder = write_beir_folder(tmp_path / "arguana", docs, {"a1": "school uniforms restrict freedom"}, {"a1": {"a2": 1}})
    out = tmp_path / "eval.json"
    invoke("eval", "--dataset", folder, "--preset", "pyserini-flat", "-w", tmp_path / "wh", "--output-json", out)
    run_lines = (tmp_path / "wh" / "runs" / "arguana-test-pyserini-flat-bm25.trec").read_text().split("\n")
    assert run_lines[0].split()[2] == "a2" and "a1" not in {line.split()[2] for line in run_lines if line}
    assert json.loads(out.read_text())["metrics"]["ndcg@10"] == pytest.approx(1.0)


def test_errors_are_one_clear_line_and_exit_code_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sira.jobs.cli", "search", "x", "--warehouse", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no published index" in proc.stderr and "Traceback" not in proc.stderr


def test_a_bad_option_value_is_one_line_naming_the_option_and_what_it_accepts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sira.jobs.cli", "eval", "-d", str(tmp_path), "--variant", "colbert"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: --variant: 'colbert' is not one of 'bm25', 'doc', 'query', 'sira', "
                                   "'sira+rerank', 'dense', 'hybrid', 'sira+dense'")


def test_search_constraints_and_program_files(tmp_path, tiny_beir, spark):
    wh = tmp_path / "wh"
    invoke("ingest", tiny_beir, "--warehouse", wh)
    invoke("index", "--warehouse", wh, "--preset", "sira", "--shards", 2)
    out = json.loads(invoke("search", "blood", "-w", wh, "-k", 12, "--json", "--exclude", "pressure").stdout)
    assert out["program"]["exclude"] == ["pressur"] and {"d06", "d08"}.isdisjoint(h["doc_id"] for h in out["hits"])
    must = json.loads(invoke("search", "blood", "-w", wh, "--json", "--must", "glucose").stdout)
    assert {h["doc_id"] for h in must["hits"]} == {"d05", "d12"}
    program_file = tmp_path / "program.json"
    program_file.write_text(json.dumps(must["program"]))
    again = json.loads(invoke("search", "-w", wh, "--json", "--program", program_file).stdout)
    assert again["hits"] == must["hits"]


def test_search_expand_through_an_openai_compatible_server(tmp_path, tiny_beir, spark, fake_openai):
    wh = tmp_path / "wh"
    invoke("ingest", tiny_beir, "--warehouse", wh)
    invoke("index", "--warehouse", wh, "--preset", "sira", "--shards", 2)
    fake_openai.answers = {"cafe caffeine": ["coffee drinking", "zebrafish"]}
    out = json.loads(invoke("search", "cafe caffeine", "-w", wh, "--json", "--expand", "--backend", "openai",
                            "--model", "fake-llm", "--base-url", fake_openai.base_url, "--tau", "0.25").stdout)
    expansions = {e["phrase"]: e["reason"] for e in out["program"]["expansions"]}
    assert expansions == {"coffee drinking": "kept", "zebrafish": "unseen"}
    assert out["program"]["w"] == 0.5 and out["hits"][0]["doc_id"] == "d09"


def test_the_expansion_weight_flag_no_longer_sits_beside_the_warehouse_flag(tmp_path):
    # `--w` (the old spelling, one letter from `-w`, the warehouse) is gone after its release of deprecation.
    proc = subprocess.run([sys.executable, "-m", "sira.jobs.cli", "search", "x", "-w", str(tmp_path), "--w", "0.3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "No such option" in proc.stderr and "--w" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "sira.jobs.cli", "search", "x", "-w", str(tmp_path),
                           "--expansion-weight", "0.3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "deprecated" not in proc.stderr


def test_every_options_default_is_its_job_configs():
    """A command given only its required options makes the same config as the job's Python defaults: a job run
    from Python (a notebook, Airflow) does what the same command does. `sira query` expanded with the local LLM
    from Python and the encoder from the command line before the options were generated from the configs."""
    import typer

    from sira.jobs import eval as eval_job, index, nightly, query, report, run, serve, sweep
    from sira.pipelines.enrichment.corpus_enrichment import EnrichConfig
    from sira.pipelines.storage.ingest import IngestConfig

    required = {  # command -> (its config, required options as on the command line, the same as fields)
        "ingest": (IngestConfig, ["beir:x", "-w", "wh"], {"source": "beir:x", "warehouse": "wh"}),
        "enrich": (EnrichConfig, ["-w", "wh"], {"warehouse": "wh"}),
        "index": (index.IndexConfig, ["-w", "wh"], {"warehouse": "wh"}),
        "query": (query.QueryConfig, ["-w", "wh", "--queries", "q.tsv", "--out", "r.trec"],
                  {"warehouse": "wh", "queries": "q.tsv", "out": "r.trec"}),
        "serve": (serve.ServeConfig, ["-w", "wh"], {"warehouse": "wh"}),
        "eval": (eval_job.EvalConfig, ["-d", "beir:x"], {"dataset": "beir:x"}),
        "run": (run.RunConfig, [], {}),
        "sweep": (sweep.SweepConfig, ["-d", "beir:x", "--split", "dev", "--param", "tau=0.1"],
                  {"dataset": "beir:x", "split": "dev", "grid": {"tau": [0.1]}}),
        "nightly": (nightly.NightlyConfig, ["-w", "wh", "--source", "s.jsonl"], {"warehouse": "wh", "source": "s.jsonl"}),
        "report": (report.ReportConfig, [], {}),
    }
    commands = typer.main.get_command(app).commands
    assert set(required) <= set(commands)
    for name, (config, args, fields) in required.items():
        ctx = commands[name].make_context(name, list(args))
        params = dict(ctx.params)
        values = commands[name].callback.values_of(params)
        values.update({k: v for k, v in fields.items() if k not in values})  # set by an option of the command's own
        assert config(**values) == config(**fields), name

