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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

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


class Tracker:
    """Thin wrapper over the MLflow fluent API; a disabled tracker accepts every call and records nothing."""

    def __init__(self, cfg: TrackingConfig | None = None):
        self.cfg = cfg or TrackingConfig()
        self.enabled = self.cfg.enabled
        self.experiment_id: str | None = None
        if not self.enabled:
            return
        import logging

        import mlflow
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no migration chatter on every start
        logging.getLogger("alembic").setLevel(logging.WARNING)
        mlflow.set_tracking_uri(self.cfg.resolved_uri())
        client = MlflowClient()
        exp = client.get_experiment_by_name(self.cfg.experiment)
        self.experiment_id = exp.experiment_id if exp else client.create_experiment(
            self.cfg.experiment, artifact_location=self.cfg.artifact_location())
        self._mlflow = mlflow

    @contextmanager
    def run(self, name: str, params: Mapping[str, Any] | BaseModel | None = None,
            tags: Mapping[str, str] | None = None, nested: bool = False) -> Iterator[str | None]:
        """Start a (nested) run; yields its run id (None when disabled)."""
        if not self.enabled:
            yield None
            return
        with self._mlflow.start_run(run_name=name, experiment_id=self.experiment_id, nested=nested,
                                    tags=dict(tags or {})) as active:
            if params is not None:
                flat = flatten(params)
                for start in range(0, len(flat), 100):  # MLflow takes at most 100 params per call
                    self._mlflow.log_params(dict(list(flat.items())[start : start + 100]))
            yield active.info.run_id

    def metrics(self, values: Mapping[str, float | int | None], prefix: str = "") -> None:
        if self.enabled:
            clean = {metric_name(prefix + k): float(v) for k, v in values.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if clean:
                self._mlflow.log_metrics(clean)

    def artifact(self, path: str | Path, folder: str | None = None) -> None:
        if self.enabled and Path(path).exists():
            self._mlflow.log_artifact(str(path), artifact_path=folder)

    def json_artifact(self, obj: Any, name: str) -> None:
        if self.enabled:
            self._mlflow.log_dict(json.loads(json.dumps(obj, default=str)), name)

    def text_artifact(self, text: str, name: str) -> None:
        if self.enabled:
            self._mlflow.log_text(text, name)

    def tags(self, values: Mapping[str, str]) -> None:
        if self.enabled:
            self._mlflow.set_tags(dict(values))
