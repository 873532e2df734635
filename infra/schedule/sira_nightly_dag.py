"""The nightly SIRA refresh as an Airflow DAG: `sira nightly` submitted to the Ray cluster of
infra/ray/cluster.yaml as a Ray job, then a check that the search service answers.

The same command as infra/schedule/crontab, under the same lock on the Ray head, so cron, this DAG and a
retry of either never run two nights at once (max_active_runs=1 covers this DAG alone). The Airflow worker
needs only the Ray CLI (`pip install "ray[default]==2.60.0"`) and curl: sira runs on the head node.
Settings come from Airflow Variables, read when a task runs (not when the DAG file is parsed).
"""

from __future__ import annotations

from datetime import datetime, timedelta

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG
except ImportError:  # Airflow 2.4+
    from airflow import DAG
    from airflow.operators.bash import BashOperator

ENV = {
    "SIRA_RAY_DASHBOARD": "{{ var.value.get('sira_ray_dashboard', 'http://ray-head.internal:8265') }}",
    "SIRA_WAREHOUSE": "{{ var.value.get('sira_warehouse', 's3a://example-sira/warehouse') }}",
    "SIRA_SOURCE": "{{ var.value.get('sira_source', '/data/exports/corpus.jsonl.gz') }}",
    "SIRA_MODEL": "{{ var.value.get('sira_model', 'Qwen/Qwen3-8B') }}",
    "SIRA_TRACKING_URI": "{{ var.value.get('sira_tracking_uri', 'http://mlflow.internal:5000') }}",
    "SIRA_SERVE_URL": "{{ var.value.get('sira_serve_url', 'http://sira-serve.internal:8080') }}",
}

# `ray job submit` tails the job's log and exits 1 when the job fails, so Airflow sees the outcome. The
# variables are expanded here, on the Airflow worker; the entrypoint then runs in a shell on the Ray head.
NIGHTLY = (
    'ray job submit --address "$SIRA_RAY_DASHBOARD" -- '
    "flock -n /tmp/sira-nightly.lock "
    'sira nightly --warehouse "$SIRA_WAREHOUSE" --source "$SIRA_SOURCE" --backend vllm --model "$SIRA_MODEL" '
    "--preset sira --shards 16 --spark-master 'local[*]' --ray-address auto --keep-days 7 "
    '--tracking-uri "$SIRA_TRACKING_URI" --output-json /var/log/sira/nightly-last.json'
)

# `sira serve` follows the newest published version by default (checked every --poll-s seconds), so a healthy
# answer after the night means the service is up; the curl retries cover a switch or restart in progress.
HEALTH = 'curl -fsS --max-time 10 --retry 5 --retry-delay 30 --retry-all-errors "$SIRA_SERVE_URL/health"'

with DAG(
    dag_id="sira_nightly",
    schedule="30 1 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,              # a missed night is not worth replaying: the next one merges the newer snapshot
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=20)},
    tags=["sira"],
) as dag:
    nightly = BashOperator(task_id="sira_nightly", bash_command=NIGHTLY, env=ENV, append_env=True,
                           execution_timeout=timedelta(hours=8))
    serve_health = BashOperator(task_id="serve_health", bash_command=HEALTH, env=ENV, append_env=True,
                                retries=3, retry_delay=timedelta(minutes=2))
    nightly >> serve_health
