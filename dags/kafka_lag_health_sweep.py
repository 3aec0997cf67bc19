"""Every minute: snapshot all consumer groups, diagnose, post, remediate."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from lagdoctor.notify.incidents import notify_run_failed, record_task_failure
from lagdoctor.pipeline import (build_pipeline, clusters_param, notify_recovery_unless_skipped, thresholds_param,
                                use_data_root)
from lagdoctor.stages.params import SWEEP_SAMPLES, SWEEP_SAMPLE_INTERVAL_S, sweep_clusters_default, sweep_schedule

with DAG(
    dag_id="kafka_lag_health_sweep",
    description="Snapshot consumer group offsets, diagnose lag with Spark, post findings and remediate.",
    schedule=sweep_schedule(),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lagdoctor", "kafka", "sweep"],
    on_success_callback=notify_recovery_unless_skipped,
    # A failure is said once the run has failed: a task whose failure the run tolerates, or one
    # beside a branch waiting for a human, is not yet a failed run.
    on_failure_callback=notify_run_failed,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1), "on_failure_callback": record_task_failure,
                  "on_execute_callback": use_data_root},
    params={
        "cluster": Param("kafka_default", type="string", minLength=1,
                         description="Airflow connection id (type kafka) of the cluster to sweep "
                                     "when `clusters` is empty."),
        "clusters": clusters_param(sweep_clusters_default()),
        "group_pattern": Param("", type="string",
                               description="Regex, full match (RE2) against the whole group id, e.g. orders-.* "
                                           "for orders-processor and orders-archiver; empty: all groups."),
        "topic": Param("", type="string", description="Only this topic; empty: all."),
        "window_minutes": Param(30, type="integer", minimum=1, maximum=1440,
                                description="History the diagnosis looks at."),
        "samples": Param(SWEEP_SAMPLES, type="integer", minimum=1, maximum=60,
                         description="Snapshots taken by each run (history accumulates across runs)."),
        "interval_seconds": Param(SWEEP_SAMPLE_INTERVAL_S, type="number", minimum=0, maximum=300,
                                  description="Seconds between a run's snapshots."),
        "thresholds": thresholds_param(),
        "dry_run": Param(True, type="boolean", description="Remediation only says what it would do."),
    },
    doc_md="""
### Kafka lag health sweep

Each run takes an offset snapshot of every consumer group (`samples`, default 1;
`interval_seconds` apart when more) on every cluster it covers, one `snapshot` task
instance per cluster, in parallel, into the Parquet store under `LAGDOCTOR_DATA_ROOT`,
so history accumulates run after run; a retention task keeps 7 days. The
PySpark diagnosis then reads the last `window_minutes` of that history and the
runbooks in `runbooks/` decide, per finding, what is posted to Slack and which
remediation starts. Remediation is a dry run unless `dry_run` is false. The
sweep never waits for a human: an action that needs approval is proposed in its
Slack thread; to carry it out, trigger `kafka_lag_incident` for that group with
`dry_run` off, which asks for approval. Every task has a time limit, and a form
value that cannot work fails the first task at once, without retry.

**Cadence.** Every minute by default (`LAGDOCTOR_SWEEP_SCHEDULE` changes the cron),
one run at a time, no catch-up. A scheduled run that starts when the next one is
already due (the run before it overran and it waited) skips: `validate_params` logs
one line saying how late it is and that the next run covers it, every task ends
skipped (not failed), nothing is snapshotted, written or posted. A run you trigger
is never skipped this way.

**Which clusters** (Airflow connection ids of type kafka; the first rule that applies wins):

1. `clusters` given in the run's form or conf: a JSON array (`["kafka_eu", "kafka_us"]`)
   or text (`kafka_eu,kafka_us`);
2. `cluster` given in the run's conf without `clusters`: that one cluster only;
3. `LAGDOCTOR_SWEEP_CLUSTERS` (comma-separated, read where this file is parsed, like
   `LAGDOCTOR_SWEEP_SCHEDULE`): the default of `clusters`, so scheduled runs cover them;
4. `cluster` (default `kafka_default`).

Every id is checked before anything runs (duplicates dropped); one that is not a
usable kafka connection fails the run at once, named. A cluster that cannot be
read fails its own `snapshot` instance, named by its id in the grid, in Slack's
failure thread and in `check_failures`; the other clusters are still diagnosed, in
one Spark job, and the run ends failed. An unread cluster gets no finding that
run: its open incident threads stay open (unknown is never healthy).
""",
) as dag:
    build_pipeline(samples=SWEEP_SAMPLES, interval_s=SWEEP_SAMPLE_INTERVAL_S, prune=True)
