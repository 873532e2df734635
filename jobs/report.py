"""`sira report`: a markdown report and PNG plots comparing our variants per dataset with the published
references, every number with the command and the MLflow run that produced it.

It reads MLflow, not files: for each dataset the newest `sira run` parent run (tag sira.job=run) and its
children (one per variant) supply the metrics, the command (tag sira.command) and the run ids.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sira.pipelines.tracking.tracking import TrackingConfig

class ReportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output_dir: str = Field("reports", description="report.md and the PNG plots go here")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    datasets: list[str] | None = Field(None, description="default: every dataset with a `sira run`")


def run(cfg: ReportConfig) -> dict:
    from sira.pipelines.tracking.report import collect, render

    return render(collect(cfg.tracking, cfg.datasets), cfg.output_dir)
