"""A Spark session with Delta Lake configured (local[*] by default, any master by URL)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Small local defaults; on a cluster pass --conf through SIRA_SPARK_CONF or spark-submit.
    "spark.sql.shuffle.partitions": "8",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.driver.memory": "4g",
}


def get_spark(master: str = "local[*]", app_name: str = "sira", conf: dict[str, str] | None = None) -> SparkSession:
    from delta import configure_spark_with_delta_pip

    # Python workers must run the interpreter that has sira installed (the job's own venv in local mode).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        # A caller's, spark-submit's or Databricks' session (infra/spark/sira_index_main.py creates it first): its
        # master and --conf settings stand; getOrCreate would re-apply our local defaults over them.
        return active
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **_env_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _env_conf() -> dict[str, str]:
    """SIRA_SPARK_CONF='k1=v1,k2=v2' overrides the defaults without code changes."""
    raw = os.environ.get("SIRA_SPARK_CONF", "")
    return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)
