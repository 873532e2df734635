"""spark-submit / Databricks application for `sira index`.

spark-submit needs a Python file, not a console script. This one runs the CLI's own `index` command, on the
session the cluster manager configured: it creates that session first (master, --conf, --packages as given to
spark-submit), so `sira.pipelines.storage.spark_session.get_spark` finds it through getOrCreate instead of starting a local[*]
one, and `sira.jobs.index` leaves it for spark-submit to stop (Databricks forbids stopping its session).
Arguments are those of `sira index`:  spark-submit ... sira_index_main.py --warehouse s3a://... --shards 64
"""

from __future__ import annotations

import sys


def index_argv(args: list[str], master: str) -> list[str]:
    """`sira index` arguments; --spark-master defaults to the master spark-submit set, so the job records it."""
    if any(a == "--spark-master" or a.startswith("--spark-master=") for a in args):
        return ["index", *args]
    return ["index", "--spark-master", master, *args]


def main() -> None:
    from pyspark.sql import SparkSession

    from sira.jobs import cli

    spark = SparkSession.builder.getOrCreate()
    sys.argv = [sys.argv[0], *index_argv(sys.argv[1:], spark.sparkContext.master)]
    cli.main()


if __name__ == "__main__":
    main()
