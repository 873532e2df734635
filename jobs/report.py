"""`sira report`: a markdown report and PNG plots comparing our variants per dataset with the published
references, every number with the command and the MLflow run that produced it.

It reads MLflow, not files: for each dataset the newest `sira run` parent run (tag sira.job=run) and its
children (one per variant) supply the metrics, the command (tag sira.command) and the run ids.
"""

from __future__ import annotations

from sira.pipelines.tracking.report import ReportConfig


def run(cfg: ReportConfig) -> dict:
    from sira.pipelines.tracking.report import collect, render

    return render(collect(cfg.tracking, cfg.datasets), cfg.output_dir)
