"""`sira index`: the Spark job that builds and publishes one index version from the docs table."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from jobs.progress import console


class IndexConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    warehouse: str
    preset: str = "sira"
    shards: int = Field(4, ge=1, le=4096)
    spark_master: str = "local[*]"


def run(cfg: IndexConfig, spark=None) -> dict:
    from pipelines.spark_index import build_index
    from pipelines.spark_session import get_spark
    from sira_core.presets import get_preset

    from pyspark.sql import SparkSession

    preset = get_preset(cfg.preset)  # fail on a bad preset before starting a JVM
    # Stop the session only if this job started it (a caller's or a test's session stays up).
    own_session = spark is None and SparkSession.getActiveSession() is None
    spark = spark or get_spark(cfg.spark_master, app_name="sira-index")
    try:
        row = build_index(spark, cfg.warehouse, preset, cfg.shards, log=console.log)
    finally:
        if own_session:
            spark.stop()
    return {**row, "built_at": row["built_at"].isoformat()}
