"""Experiment tracking with MLflow: a local SQLite backend by default, any tracking URI when given.

One parent run per job invocation (`sira run`, `sira sweep`, `sira nightly`), a child run per unit of work
(a dataset x variant, a grid point); the job's whole typed config is logged as params, metric names are
UI-safe (`ndcg@10` -> `ndcg_at_10`), and artifacts (TREC runs, programs, samples, reports) go to an explicit
artifact location next to the database.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ROOT = "mlruns"
DEFAULT_EXPERIMENT = "sira"
_MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    tracking_uri: str | None = Field(None, description="default: sqlite:///<root>/mlflow.db (env MLFLOW_TRACKING_URI "
                                                       "wins when set)")
    experiment: str = DEFAULT_EXPERIMENT
    root: str = Field(DEFAULT_ROOT, description="folder of the default SQLite database and artifacts")

    def resolved_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        root = Path(self.root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{root / 'mlflow.db'}"

    def artifact_location(self) -> str | None:
        """For a new experiment on a local database: artifacts in <root>/artifacts (never the working
        directory). A tracking server decides its own artifact store."""
        if not self.resolved_uri().startswith("sqlite:"):
            return None
        return (Path(self.root).resolve() / "artifacts").as_uri()


def metric_name(name: str) -> str:
    """`ndcg@10` -> `ndcg_at_10`; anything MLflow rejects becomes `_`."""
    return re.sub(r"[^0-9A-Za-z_\-. /]", "_", name.replace("@", "_at_"))


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted params (lists and long values as JSON, cut to MLflow's limit)."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    out: dict[str, str] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    value = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    out[prefix.rstrip(".")] = value[:_MAX_PARAM_CHARS]
    return out


class TrackedRun:
    """A run started by `Tracker.run`: its id once MLflow has created it (None when tracking is off)."""

    def __init__(self, tracker: "Tracker | None" = None, created: Future | None = None):
        self._tracker, self._created = tracker, created

    @property
    def id(self) -> str | None:
        return self._tracker._result(self._created) if self._created is not None else None


class Tracker:
    """MLflow's client off the job's critical path. Importing MLflow and opening its store take 5-10 s of CPU, so one
    worker thread makes every MLflow call, in order, while the job goes on: a run's start and end times and each
    metric's timestamp are taken when the job calls, not when the thread gets to them. The job waits for the thread
    only for a run's id, an artifact file, and when its outermost run ends, where a tracking error is raised. With
    `defer`, the thread starts loading MLflow only at `connect()` (or when something waits for it): a job whose first
    step keeps its Python thread busy (a night's ingest) calls it when the driver's Python is idle, as while the
    JVM builds an index; two CPU-bound threads would slow each other down on the GIL. A disabled tracker accepts
    every call and records nothing."""

    def __init__(self, cfg: TrackingConfig | None = None, defer: bool = False):
        self.cfg = cfg or TrackingConfig()
        self.enabled = self.cfg.enabled
        self._open: list[Future] = []  # ids of the runs started and not yet ended, innermost last
        # Until connect(), calls wait here, not on the worker: a thread blocked waiting would hold up the
        # interpreter's exit (it joins the worker) if the job never got to connect.
        self._connected: Future | None = None
        self._pending: list[tuple[Callable, Future]] = []
        self._calls: list[Future] = []  # every call not yet waited for, in order
        if not self.enabled:
            return
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow")
        if not defer:
            self.connect()

    def connect(self) -> None:
        """Load MLflow on the worker (a deferred tracker's, only now) and make the calls so far."""
        if not self.enabled or self._connected is not None:
            return
        self._connected = self._worker.submit(self._open_store, self.cfg.resolved_uri(), self.cfg.experiment,
                                              self.cfg.artifact_location())
        for call, future in self._pending:
            _chain(self._worker.submit(call), future)
        self._pending = []

    @staticmethod
    def _open_store(uri: str, experiment: str, artifact_location: str | None):
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no migration chatter on every start
        logging.getLogger("alembic").setLevel(logging.WARNING)
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        return client, exp.experiment_id if exp else client.create_experiment(experiment, artifact_location=artifact_location)

    def _submit(self, fn, *args) -> Future:
        """fn(client, experiment_id, *args) on the worker, after every earlier call; an earlier failure fails it too."""
        def call():
            client, experiment_id = self._connected.result()
            return fn(client, experiment_id, *[a.result() if isinstance(a, Future) else a for a in args])
        if self._connected is not None:
            future = self._worker.submit(call)
        else:
            future = Future()
            self._pending.append((call, future))
        self._calls.append(future)
        return future

    def _result(self, future: Future):
        self.connect()  # nothing waits on a deferred start
        return future.result()

    def _wait(self) -> None:
        """Block until every call so far is done; raise the first that failed."""
        self.connect()
        calls, self._calls = self._calls, []
        for call in calls:
            call.result()

    @staticmethod
    def _create(client, experiment_id: str, name: str, start_ms: int, tags: dict, parent_id: str | None,
                params: dict[str, str]) -> str:
        from mlflow.entities import Param
        from mlflow.tracking.context.registry import resolve_tags

        if parent_id is not None:
            tags = {**tags, "mlflow.parentRunId": parent_id}
        run_id = client.create_run(experiment_id, start_time=start_ms, tags=resolve_tags(tags),
                                   run_name=name).info.run_id
        items = list(params.items())
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            client.log_batch(run_id, params=[Param(k, v) for k, v in items[start : start + 100]])
        return run_id

    @contextmanager
    def run(self, name: str, params: Mapping[str, Any] | BaseModel | None = None,
            tags: Mapping[str, str] | None = None, nested: bool = False) -> Iterator[TrackedRun]:
        """Start a run (a child of the innermost open one when `nested`); yields it (its `id` waits for MLflow)."""
        if not self.enabled:
            yield TrackedRun()
            return
        parent = self._open[-1] if nested and self._open else None
        created = self._submit(self._create, name, _now_ms(), dict(tags or {}), parent,
                               flatten(params) if params is not None else {})
        self._open.append(created)
        status = "FAILED"
        try:
            yield TrackedRun(self, created)
            status = "FINISHED"
        finally:
            self._open.pop()
            self._submit(lambda client, _, run_id, end_ms: client.set_terminated(run_id, status, end_ms),
                         created, _now_ms())
            if not self._open:
                if status == "FINISHED":
                    self._wait()
                else:  # the job's own error is the one raised
                    with suppress(Exception):
                        self._wait()

    def _current(self) -> Future:
        if not self._open:
            raise RuntimeError("no tracked run is open")
        return self._open[-1]

    def metrics(self, values: Mapping[str, float | int | None], prefix: str = "") -> None:
        if self.enabled:
            clean = {metric_name(prefix + k): float(v) for k, v in values.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if clean:
                from_job = _now_ms()

                def log(client, _, run_id):
                    from mlflow.entities import Metric
                    client.log_batch(run_id, metrics=[Metric(k, v, from_job, 0) for k, v in clean.items()])
                self._submit(log, self._current())

    def artifact(self, path: str | Path, folder: str | None = None) -> None:
        if self.enabled and Path(path).exists():
            # Waited for: the job may move or delete the file once this returns.
            self._result(self._submit(
                lambda client, _, run_id: client.log_artifact(run_id, str(path), artifact_path=folder), self._current()))

    def json_artifact(self, obj: Any, name: str) -> None:
        if self.enabled:
            data = json.loads(json.dumps(obj, default=str))  # as it is now, not when the worker gets to it
            self._submit(lambda client, _, run_id: client.log_dict(run_id, data, name), self._current())

    def text_artifact(self, text: str, name: str) -> None:
        if self.enabled:
            self._submit(lambda client, _, run_id: client.log_text(run_id, text, name), self._current())

    def tags(self, values: Mapping[str, str]) -> None:
        if self.enabled:
            given = dict(values)

            def tag(client, _, run_id):
                for k, v in given.items():
                    client.set_tag(run_id, k, v)
            self._submit(tag, self._current())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _chain(source: Future, target: Future) -> None:
    """Settle `target` as `source` settles."""
    def done(f: Future) -> None:
        if f.exception() is not None:
            target.set_exception(f.exception())
        else:
            target.set_result(f.result())
    source.add_done_callback(done)
