"""Run files and the paired comparison of two runs (sira.core.metrics, `sira compare`)."""

import json
import math

import pytest

from sira.core.metrics import evaluate_run, paired_comparison, read_trec_run, write_trec_run

QRELS = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}, "q4": {"d": 1}}


def test_trec_run_round_trip_and_a_bad_line_is_named(tmp_path):
    run = {"q1": {"a": 2.5, "x": 1.0}, "q2": {"b": 0.5}}
    write_trec_run(run, tmp_path / "r.trec", "t")
    assert read_trec_run(tmp_path / "r.trec") == run
    (tmp_path / "bad.trec").write_text("q1 Q0 a 1 2.5 t\nq1 Q0 b 2 high t\n")
    with pytest.raises(ValueError, match=r"bad.trec:2: score 'high' is not a number"):
        read_trec_run(tmp_path / "bad.trec")
    (tmp_path / "short.trec").write_text("q1 a 1 2.5\n")
    with pytest.raises(ValueError, match=r"short.trec:1: expected 6 columns"):
        read_trec_run(tmp_path / "short.trec")


def test_paired_comparison_worked_example():
    # base finds the relevant doc first for q1, q2; run for all four (q3 lacks hits in base: scores 0).
    base = {"q1": {"a": 2, "x": 1}, "q2": {"b": 2, "x": 1}, "q4": {"x": 2, "d": 1}}
    run = {"q1": {"a": 2, "x": 1}, "q2": {"b": 2, "x": 1}, "q3": {"c": 1}, "q4": {"d": 2, "x": 1}}
    result = paired_comparison(QRELS, base, run, "ndcg@10", permutations=2000, seed=1)
    assert result["base"] == pytest.approx(evaluate_run(QRELS, base)["ndcg@10"])
    assert result["run"] == pytest.approx(1.0) and result["delta"] == pytest.approx(1.0 - result["base"])
    assert (result["wins"], result["losses"], result["ties"], result["queries"]) == (2, 0, 2, 4)
    assert result["per_query"]["q3"] == {"base": 0.0, "run": 1.0} and result["per_query"]["q1"] == {"base": 1.0, "run": 1.0}
    assert result["per_query"]["q4"]["base"] == pytest.approx(1 / math.log2(3))  # d at rank 2
    # Two positive differences among four queries: a random swap is as extreme when both keep their sign or both
    # flip (the ties do not matter), 2 of the 4 sign patterns.
    assert result["p_value"] == pytest.approx(0.5, abs=0.05)
    assert paired_comparison(QRELS, base, run, "ndcg@10", permutations=2000, seed=1) == result  # seeded
    same = paired_comparison(QRELS, base, base, "ndcg@10", permutations=500)
    assert same["delta"] == 0 and same["p_value"] == 1.0 and same["ties"] == 4


def test_compare_command(tmp_path, tiny_beir):
    from typer.testing import CliRunner

    from sira.jobs.cli import app

    qrels = {"q1": {"d01": 1, "d02": 1}, "q2": {"d05": 2, "d12": 1}, "q3": {"d10": 1, "d06": 1}, "q4": {"d09": 1},
             "q5": {"d03": 1}}
    write_trec_run({q: {"d11": 1.0} for q in qrels}, tmp_path / "base.trec", "base")
    write_trec_run({q: {d: float(r) for d, r in rel.items()} for q, rel in qrels.items()}, tmp_path / "run.trec", "run")
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "base.trec"), str(tmp_path / "run.trec"),
                                      "-d", str(tiny_beir), "--permutations", "1000",
                                      "--output-json", str(tmp_path / "cmp.json"), "--plot", str(tmp_path / "cmp.png")],
                            catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "cmp.json").read_text())
    assert summary["base"] == 0 and summary["run"] == pytest.approx(1.0)
    assert (summary["wins"], summary["losses"], summary["queries"]) == (5, 0, 5)
    assert summary["p_value"] == pytest.approx(2 / 32, abs=0.03)  # only all-kept or all-flipped signs are as extreme
    assert summary["per_query"]["q2"] == {"base": 0.0, "run": pytest.approx(1.0)}
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
