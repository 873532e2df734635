"""The MLflow tracker: every call lands in a real SQLite store, in order, with the times the job called at, though a
worker thread makes the calls."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sira.pipelines.tracking.tracking import Tracker, TrackingConfig


@pytest.fixture
def tracking(tmp_path):
    return TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="tracker", root=str(tmp_path))


def test_runs_params_metrics_and_artifacts_land_in_order_with_the_jobs_times(tracking, tmp_path):
    from mlflow.tracking import MlflowClient

    tracker = Tracker(tracking)
    before = int(time.time() * 1000)
    run_file = tmp_path / "run.trec"
    run_file.write_text("q1 Q0 d1 1 2.5 sira\n")
    with tracker.run("parent", params={"a": 1, "nested": {"b": "x"}, "many": {str(i): i for i in range(150)}},
                     tags={"sira.job": "test"}) as parent:
        with tracker.run("child", nested=True, tags={"sira.step": "one"}) as child:
            time.sleep(0.05)
            tracker.metrics({"ndcg@10": 0.5, "skipped": None, "flag": True, "n": 3})
            tracker.artifact(run_file, "runs")
        child_done = int(time.time() * 1000)
        tracker.json_artifact({"k": [1, 2]}, "sample.json")
        tracker.text_artifact("# report", "report.md")
        tracker.tags({"sira.note": "done"})
        tracker.metrics({"seconds": 1.25})
    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    p, c = client.get_run(parent.id), client.get_run(child.id)
    assert p.info.status == c.info.status == "FINISHED"
    assert c.data.tags["mlflow.parentRunId"] == parent.id
    assert p.data.tags["sira.job"] == "test" and p.data.tags["sira.note"] == "done"
    assert p.data.params["a"] == "1" and p.data.params["nested.b"] == "x" and p.data.params["many.149"] == "149"
    assert c.data.metrics == {"ndcg_at_10": 0.5, "n": 3.0}  # bools and None are not metrics
    assert p.data.metrics == {"seconds": 1.25}
    # Times are the job's: the child started after the parent and ended before the job went on.
    assert before <= p.info.start_time <= c.info.start_time < c.info.end_time <= child_done <= p.info.end_time
    assert c.info.end_time - c.info.start_time >= 50
    assert [f.path for f in client.list_artifacts(child.id, "runs")] == ["runs/run.trec"]
    assert {f.path for f in client.list_artifacts(parent.id)} == {"sample.json", "report.md"}


def test_a_failed_job_marks_its_runs_failed_and_raises_its_own_error(tracking):
    from mlflow.tracking import MlflowClient

    tracker = Tracker(tracking)
    with pytest.raises(ZeroDivisionError):
        with tracker.run("parent") as parent:
            with tracker.run("child", nested=True) as child:
                1 / 0
    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    assert client.get_run(parent.id).info.status == client.get_run(child.id).info.status == "FAILED"


def test_a_tracking_failure_is_raised_when_the_outermost_run_ends(tmp_path):
    from mlflow.exceptions import MlflowException

    tracker = Tracker(TrackingConfig(tracking_uri="nosuchscheme://tracking", root=str(tmp_path)))
    with pytest.raises(MlflowException, match="nosuchscheme"):
        with tracker.run("parent"):
            tracker.metrics({"x": 1})


def test_a_disabled_tracker_records_nothing():
    tracker = Tracker(TrackingConfig(enabled=False))
    with tracker.run("parent", params={"a": 1}) as parent:
        tracker.metrics({"x": 1})
        tracker.json_artifact({}, "a.json")
    assert parent.id is None


def test_a_deferred_tracker_loads_mlflow_only_when_asked_and_still_records_everything(tracking):
    from mlflow.tracking import MlflowClient

    tracker = Tracker(tracking, defer=True)
    with tracker.run("parent", params={"a": 1}) as parent:
        with tracker.run("step", nested=True):
            tracker.metrics({"seconds": 2.0})
        time.sleep(0.2)
        assert tracker._connected is None  # nothing asked for MLflow yet
        tracker.connect()
        with tracker.run("later", nested=True):
            tracker.metrics({"seconds": 1.0})
    client = MlflowClient(tracking_uri=tracking.tracking_uri)
    children = client.search_runs([client.get_run(parent.id).info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.id}'")
    assert sorted((r.info.run_name, r.data.metrics["seconds"]) for r in children) == [("later", 1.0), ("step", 2.0)]


def test_a_deferred_tracker_that_never_ran_lets_the_process_exit(tracking, tmp_path):
    # Nothing waits on the worker before connect(): an interpreter that never connected exits at once.
    script = tmp_path / "never.py"
    script.write_text("from sira.pipelines.tracking.tracking import Tracker, TrackingConfig\n"
                      f"Tracker(TrackingConfig(tracking_uri={tracking.tracking_uri!r}), defer=True)\n")
    subprocess.run([sys.executable, str(script)], check=True, timeout=60)
