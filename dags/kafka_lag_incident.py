"""Manual incident run: a deeper look at the groups an on-call engineer names."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from lagdoctor.notify.incidents import notify_recovery, notify_run_failed, record_task_failure
from lagdoctor.pipeline import build_pipeline, thresholds_param, use_data_root

with DAG(
    dag_id="kafka_lag_incident",
    description="Diagnose one incident: the named groups, a deeper window, one Slack thread.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # A few at once: leases in the state database keep two runs from acting on one group.
    max_active_runs=3,
    tags=["lagdoctor", "kafka", "incident"],
    on_success_callback=notify_recovery,
    # A failure is said once the run has failed: a task whose failure the run tolerates, or one
    # beside a branch waiting for a human, is not yet a failed run.
    on_failure_callback=notify_run_failed,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30), "on_failure_callback": record_task_failure,
                  "on_execute_callback": use_data_root},
    params={
        "cluster": Param("kafka_default", type="string", minLength=1, title="Cluster",
                         description="Airflow connection id (type kafka) of the cluster."),
        "group_pattern": Param(".*", type="string", minLength=1, title="Consumer groups",
                               description="Regex, full match (RE2) against the whole group id: orders-.* "
                                           "matches orders-processor and orders-archiver; orders alone matches "
                                           "only a group named exactly orders. A pattern that matches no group "
                                           "fails the run at once, naming the closest group ids."),
        "topic": Param("", type=["string", "null"], title="Topic (optional)",
                       description="Only this topic; empty for all topics of the groups."),
        "window_minutes": Param(120, type="integer", minimum=1, maximum=10080, title="Window (minutes)",
                                description="How much stored history to diagnose."),
        "thresholds": thresholds_param(),
        "dry_run": Param(True, type="boolean", title="Dry run",
                         description="Remediation only says what it would do; nothing waits for approval."),
        "samples": Param(6, type="integer", minimum=1, maximum=60, title="Fresh samples",
                         description="Snapshots taken now, before diagnosing (merged with stored history)."),
        "interval_seconds": Param(5, type="number", minimum=0, maximum=300, title="Seconds between samples"),
    },
    doc_md="""
### Kafka lag incident

Trigger with the form: name the cluster connection and a regex of consumer
groups, matched in full (`orders-.*`, not `orders`). A pattern that matches no
group on the cluster fails the `snapshot` task at once with the closest group
ids, before any diagnosis. The run takes `samples` fresh snapshots `interval_seconds` apart
(enough to diagnose on a fresh install with no history), merges them with the
stored history of the last `window_minutes`, runs the PySpark diagnosis and
posts what it finds. With `dry_run` on (the default) remediation only says what
it would do; turned off, irreversible actions wait for approval here, and the
approval names the action, its target and its effect. An approved action that a
guardrail then blocks shows as skipped, with the reason in its log and in Slack.
""",
) as dag:
    build_pipeline(samples=6, interval_s=5.0, prune=False, one_thread_per_run=True)
