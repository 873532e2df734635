"""`sira sweep`: a grid over tau, w and the n-gram order, selected on a train/dev split by one metric, then the
chosen setting evaluated once on test. Never selects on test. Everything is logged to MLflow: a parent run, a
child per grid point (its split's metrics), and a child for the final test evaluation.
"""

from __future__ import annotations

import itertools
import time
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from sira.pipelines.tracking.console import console
from sira.pipelines.enrichment.backend_config import BackendConfig
from sira.pipelines.tracking.tracking import Tracker, TrackingConfig
from sira.core.defaults import IndexBuildParams
from sira.core.variants import SINGLE_CALL_VARIANTS, SIRA_VARIANT, SingleCallVariant, help_text

SWEEPABLE = ("tau", "w", "n")


class SweepConfig(IndexBuildParams):
    model_config = ConfigDict(extra="forbid")

    dataset: str
    warehouse: str | None = None
    split: Literal["train", "dev"] = Field(description="the split the setting is selected on (never test)")
    test_split: str = "test"
    variant: SingleCallVariant = Field(SIRA_VARIANT, description=help_text(SINGLE_CALL_VARIANTS))
    grid: dict[str, list[float]] = Field(description="NAME=V1,V2 for tau, w or n (the n-gram order): the values to "
                                                     "try; repeatable")
    metric: str = "ndcg@10"
    backend: BackendConfig = Field(default_factory=BackendConfig)
    doc_backend: BackendConfig | None = None
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("grid", mode="before")
    @classmethod
    def _numbers(cls, grid: dict) -> dict:
        """--param NAME=V1,V2 gives the values as one text (NAME=V: one number)."""
        try:
            return {name: [float(v) for v in str(values).split(",") if v.strip()]
                    if isinstance(values, (str, int, float)) else values for name, values in grid.items()}
        except ValueError:
            raise ValueError(f"values must be numbers: {grid}") from None

    @field_validator("grid")
    @classmethod
    def _known(cls, grid: dict[str, list[float]]) -> dict[str, list[float]]:
        unknown = set(grid) - set(SWEEPABLE)
        if unknown:
            raise ValueError(f"cannot sweep {sorted(unknown)}; sweepable: {', '.join(SWEEPABLE)}")
        if any(not values for values in grid.values()):
            raise ValueError("every swept parameter needs at least one value")
        for n in grid.get("n", []):
            if n not in (1, 2, 3, 4):
                raise ValueError(f"n-gram order must be 1..4, got {n}")
        return grid


def points(grid: dict[str, list[float]]) -> list[dict[str, float]]:
    names = sorted(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


def _eval_config(cfg: SweepConfig, point: dict[str, float], split: str):
    from sira.jobs import eval as eval_job

    preset = cfg.preset + (f"@n={int(point['n'])}" if "n" in point else "")
    extra = {k: point[k] for k in ("tau", "w") if k in point}
    return eval_job.EvalConfig(dataset=cfg.dataset, warehouse=cfg.warehouse, preset=preset, split=split,
                               variant=cfg.variant, backend=cfg.backend, doc_backend=cfg.doc_backend,
                               shards=cfg.shards, spark_master=cfg.spark_master, **extra)


def run(cfg: SweepConfig) -> dict:
    from sira.jobs import eval as eval_job

    grid = points(cfg.grid)
    console.log(f"sweep {cfg.dataset} ({cfg.variant}): {len(grid)} settings on {cfg.split}, best by {cfg.metric}, "
                f"then once on {cfg.test_split}")
    tracker = Tracker(cfg.tracking)
    started = time.perf_counter()
    tried = []
    with tracker.run(f"sweep {cfg.dataset}/{cfg.variant}", params=cfg, tags={"sira.job": "sweep"}) as parent:
        for i, point in enumerate(grid, 1):
            ecfg = _eval_config(cfg, point, cfg.split)
            console.rule(f"[bold]{i}/{len(grid)} {point} on {cfg.split}")
            with tracker.run(f"{cfg.split} {point}", params=ecfg, nested=True,
                             tags={"sira.split": cfg.split, "sira.role": "selection"}) as child:
                summary = eval_job.run(ecfg)
                tracker.metrics(summary["metrics"])
            tried.append({"point": point, "metrics": summary["metrics"], "mlflow_run_id": child.id})
        # Ties go to the earlier point of the sorted grid, so the choice is deterministic.
        best = max(tried, key=lambda t: t["metrics"][cfg.metric])
        tracker.metrics({f"selected.{k}": v for k, v in best["point"].items()})
        ecfg = _eval_config(cfg, best["point"], cfg.test_split)
        console.rule(f"[bold]selected {best['point']}: once on {cfg.test_split}")
        with tracker.run(f"{cfg.test_split} {best['point']}", params=ecfg, nested=True,
                         tags={"sira.split": cfg.test_split, "sira.role": "final"}) as final:
            test = eval_job.run(ecfg)
            tracker.metrics(test["metrics"])
            tracker.artifact(test["run_file"], "runs")
        tracker.metrics({f"test.{k}": v for k, v in test["metrics"].items()})
    return {"dataset": cfg.dataset, "variant": cfg.variant, "split": cfg.split, "metric": cfg.metric,
            "tried": tried, "selected": best["point"], "selected_on": best["metrics"],
            "test": {"split": cfg.test_split, "metrics": test["metrics"], "mlflow_run_id": final.id},
            "mlflow_run_id": parent.id, "seconds": time.perf_counter() - started}
