"""Answer coverage: the share of queries whose gold answer string appears in the top-k passages."""

import gzip
import json

import pytest

from sira.core.datasets import resolve_dataset
from sira.core.metrics import answer_coverage

from conftest import write_beir_folder


def test_answer_coverage_matches_normalised_whole_words():
    passages = {"a": "The Eiffel Tower is in Paris.", "b": "Berlin, the capital.", "c": "Parisian cafés"}
    run = {"q1": {"a": 2.0, "b": 1.0}, "q2": {"c": 3.0, "b": 1.0}, "q3": {}}
    answers = {"q1": ["paris"], "q2": ["Paris"], "q3": ["x"]}
    assert answer_coverage(run, answers, passages, k=1) == pytest.approx(1 / 3)  # "Parisian" is not "Paris"
    assert answer_coverage({"q2": {"c": 3.0, "b": 1.0}}, {"q2": ["BERLIN"]}, passages, k=1) == 0.0
    assert answer_coverage({"q2": {"c": 3.0, "b": 1.0}}, {"q2": ["BERLIN"]}, passages, k=2) == 1.0
    with pytest.raises(ValueError):
        answer_coverage(run, {}, passages)


def test_datasets_read_answers_from_query_metadata(tmp_path):
    folder = write_beir_folder(tmp_path / "qa")
    with gzip.open(folder / "queries.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"_id": "q1", "text": "capital of France", "metadata": {"answer": "Paris"}}) + "\n")
        fh.write(json.dumps({"_id": "q2", "text": "who", "answers": ["A", "B"]}) + "\n")
        fh.write(json.dumps({"_id": "q3", "text": "no answer"}) + "\n")
    ds = resolve_dataset(str(folder))
    assert ds.answers() == {"q1": ["Paris"], "q2": ["A", "B"]}
    assert resolve_dataset(str(write_beir_folder(tmp_path / "plain"))).answers() == {}
