#!/usr/bin/env bash
# Build one index version on a Spark cluster: `sira index` through spark-submit, with the Delta packages.
#
#   SPARK_MASTER=spark://spark-master:7077 SIRA_WAREHOUSE=s3a://example-sira/warehouse \
#     infra/spark/spark-submit-index.sh --shards 64 --preset sira
#
# Arguments after the script are `sira index` options. Client deploy mode: the driver runs here, in the Python
# environment that has sira installed (PYSPARK_DRIVER_PYTHON). Executors run the same analysis code (mapInArrow),
# so they need sira too: from SIRA_ENV_ARCHIVE (a venv-pack archive of that environment, shipped with --archives)
# or installed on every node at the same interpreter path.
set -euo pipefail

: "${SPARK_MASTER:?set SPARK_MASTER (spark://host:7077, yarn, k8s://https://host:443, local[4])}"
: "${SIRA_WAREHOUSE:?set SIRA_WAREHOUSE (a path every node sees, or s3a://bucket/prefix)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The coordinate sira.pipelines.storage.spark_session.get_spark asks for (delta-spark 4.4.0 for pyspark 4.2.0); under
# spark-submit the JVM is already up when Python runs, so spark-submit must fetch the jars itself.
packages="io.delta:delta-spark_4.2_2.13:4.4.0"
# Static settings: too late once the session exists, so they go on the command line.
conf=(--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
      --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
case "$SIRA_WAREHOUSE" in
  s3a://* | s3://*)
    # hadoop-aws must match the Hadoop that pyspark 4.2.0 ships (hadoop-client-api 3.5.0).
    packages+=",org.apache.hadoop:hadoop-aws:3.5.0"
    while read -r key value; do
      [[ -z "$key" || "$key" == \#* ]] || conf+=(--conf "$key=$value")
    done < "$here/../warehouse/spark-s3a.conf"
    ;;
esac

# The index build sizes spark.sql.shuffle.partitions from its input unless it is set: SIRA_SHUFFLE_PARTITIONS pins it.
if [[ -n "${SIRA_SHUFFLE_PARTITIONS:-}" ]]; then conf+=(--conf "spark.sql.shuffle.partitions=$SIRA_SHUFFLE_PARTITIONS"); fi
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-python3}"
if [[ -n "${SIRA_ENV_ARCHIVE:-}" ]]; then
  conf+=(--archives "$SIRA_ENV_ARCHIVE#environment")
  export PYSPARK_PYTHON=./environment/bin/python
else
  export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYSPARK_DRIVER_PYTHON}"
fi

exec "${SPARK_SUBMIT:-spark-submit}" \
  --master "$SPARK_MASTER" \
  --deploy-mode client \
  --name sira-index \
  --packages "$packages" \
  "${conf[@]}" \
  "$here/sira_index_main.py" --warehouse "$SIRA_WAREHOUSE" "$@"
