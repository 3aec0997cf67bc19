"""The task graph both DAGs share: validate -> snapshot -> diagnose -> plan -> Slack -> branch -> remediation.

Only wiring: each task body is a call into a `lagdoctor.stages` module. The
remediation branches come from the actions registered in code, so editing a
runbook never changes the DAG's shape. Run-time values come from the DAG's
params, checked once by the first task, so the scheduled sweep and a manual
incident run share one graph.

    validate_params -> list_clusters -> snapshot[cluster] (mapped, one per cluster) -> prepare_diagnosis
        -> diagnose (spark-submit, every snapshotted cluster in one job) -> plan
        -> write_reports -> post_findings (also when the reports failed) -> route
    route -> remediate_<action>.gate -> [remediate_<action>.approve] -> remediate_<action>.run   (incident)
    route -> remediate_<action>.run                                                              (sweep)
    every non-branch task -> check_failures   (fails the run when any of them failed)

One cluster that cannot be read fails its own snapshot instance (named by its
connection id) and nothing else: prepare_diagnosis runs once every snapshot is
done and at least one succeeded, and diagnoses only those; check_failures then
fails the run, naming the cluster. The incident DAG maps over its one cluster.

Failures a retry cannot fix (the form, an incident's pattern that matches no
group, the job's bad-input exit codes, a runbook error, Slack messages left in
the outbox) fail at once, without retry. In the incident DAG, `approve` asks per
target (one option per group on cluster/topic, "Reject all" the default) only for
targets the guard lets run now, and not at all when it blocks every one; `run`
acts for the ticked targets alone and records the others rejected. A real
remediation that a guardrail blocks fails the incident run with the reason
(before or after the approval); the sweep, where a cooldown is routine, skips it
(failed, if it acted for another group).
Every task has an execution timeout, so nothing holds the sweep forever, and a scheduled
sweep that starts when the next is already due skips in validate_params (skip_if_late):
every task skipped, nothing written or posted; a triggered run never skips this way.
Reports never hold back Slack: a report that fails or times out fails its own task
(no retry) and the run, and post_findings still posts the findings (without report links).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import TaskGroup, get_current_context, task

from lagdoctor.notify.approvals import SlackApprovalNotifier
from lagdoctor.remediation import action_names, approval_meta, get_action
from lagdoctor.stages import collect as collect_stage, diagnose as diagnose_stage, housekeeping as housekeeping_stage
from lagdoctor.stages import notify as notify_stage, params as params_stage, plan as plan_stage
from lagdoctor.stages import remediate as remediate_stage
from lagdoctor.stages.common import LATE_RUN_KEY, SNAPSHOT_TASK_ID, VALIDATE_TASK_ID, late_run, run_failure_line

log = logging.getLogger(__name__)

POST_TASK_ID = "post_findings"
REPORTS_TASK_ID = "write_reports"
REPORT_ERROR_KEY = "report_error"
PLAN_TASK_ID = "plan"
CHECK_TASK_ID = "check_failures"
APPROVAL_TIMEOUT = timedelta(hours=1)

# Execution timeouts. The snapshot's is narrowed per run (samples x interval,
# plus each sample's own read budget); the ceiling covers the largest form allowed.
SNAPSHOT_SAMPLE_BUDGET_S = 30  # one sample's reads; an unreachable cluster fails within 30 s
SNAPSHOT_MARGIN_S = 60
SNAPSHOT_TIMEOUT_CEILING = timedelta(
    seconds=params_stage.MAX_SAMPLING_SECONDS + 60 * SNAPSHOT_SAMPLE_BUDGET_S + SNAPSHOT_MARGIN_S)
TIMEOUTS = {
    "validate_params": timedelta(minutes=2),
    "list_clusters": timedelta(minutes=2),
    "prepare_diagnosis": timedelta(minutes=5),
    "diagnose": timedelta(minutes=30),
    "plan": timedelta(minutes=5),
    "write_reports": timedelta(minutes=10),
    "post_findings": timedelta(minutes=10),
    "route": timedelta(minutes=2),
    "gate": timedelta(minutes=2),
    "approve": timedelta(minutes=5),  # before it waits; the wait itself is APPROVAL_TIMEOUT
    "run": timedelta(minutes=15),
    "prune_history": timedelta(minutes=15),
    "compact_history": timedelta(minutes=15),
    "check_failures": timedelta(minutes=2),
}


def snapshot_timeout(samples: int, interval_s: float) -> timedelta:
    return timedelta(seconds=samples * interval_s + samples * SNAPSHOT_SAMPLE_BUDGET_S + SNAPSHOT_MARGIN_S)


@contextmanager
def no_retry(*errors: type[BaseException]) -> Iterator[None]:
    """Turn errors a retry cannot fix into AirflowFailException: one line, failed at once."""
    from airflow.sdk.exceptions import AirflowFailException

    try:
        yield
    except errors as exc:
        raise AirflowFailException(" ".join(str(exc).split())) from None


def _connection(conn_id: str):
    """The Spark connection, or None when it is not defined (the provider's defaults apply)."""
    from airflow.sdk.bases.hook import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _connection_extra(conn_id: str) -> dict[str, Any]:
    """The Spark connection's extra (spark-binary, deploy-mode, and lagdoctor's `conf` object)."""
    conn = _connection(conn_id)
    return dict(conn.extra_dejson or {}) if conn is not None else {}


CONNECT_CONN_TYPE = "spark_connect"
CONNECT_STOP_GRACE_S = 15.0  # the job interrupts its queries on the server on SIGTERM
PARENT_PID_ENV = "LAGDOCTOR_PARENT_PID"  # spark_jobs/diagnose_lag.py dies with the process it names


def stop_connect_client(proc) -> None:
    """TERM to the client's group (it interrupts its queries on the server, then exits), KILL
    after the grace; returns once it is gone."""
    from lagdoctor.connectserver import stop_process_group

    stop_process_group(proc, grace_s=CONNECT_STOP_GRACE_S)


class DiagnoseLagOperator(SparkSubmitOperator):
    """spark_jobs/diagnose_lag.py on the `spark_default` connection; its type chooses how.

    - `spark` (the provider's spark-submit connection): spark-submit to its master;
    - `spark_connect`: the same job, the same arguments, as a Spark Connect client of a
      long-lived server (lagdoctor.connectserver): no JVM start per run.

    Its application, arguments and --py-files zip are built at run time by the
    prepare task (XCom), not at parse time: the scheduler parses DAG files all
    the time and must not build zips or touch the store.
    """

    def __init__(self, *, prepare_task_id: str, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", diagnose_stage.SPARK_CONN_ID)
        kwargs.setdefault("name", "lagdoctor-diagnose-lag")
        super().__init__(application="", **kwargs)
        self.prepare_task_id = prepare_task_id
        self._connect_proc = None

    def execute(self, context: Any) -> None:
        import tempfile

        from lagdoctor.notify.redact import one_line
        from lagdoctor.runindex import clear_failed, mark_failed

        prep = context["ti"].xcom_pull(task_ids=self.prepare_task_id)
        conn = _connection(self._conn_id)
        clear_failed(prep["output"])  # this try's outcome decides, not the last one's
        try:
            with tempfile.TemporaryDirectory(prefix="lagdoctor-submit-") as private:  # 0700, removed after
                if conn is not None and conn.conn_type == CONNECT_CONN_TYPE:
                    self.run_on_connect(prep, private)
                    return
                self._hook = self.prepared_hook(prep, private)
                self._submit(context)
        except BaseException as exc:
            # A failed try's folder is never current, whatever a job still running writes to it later.
            mark_failed(prep["output"], f"the diagnose task failed: {one_line(exc) or type(exc).__name__}")
            raise

    def run_on_connect(self, prep: dict[str, Any], private_dir: str) -> None:
        """The job as a client of the connection's Spark Connect server; its output goes to the
        task log line by line, and its exit code decides as spark-submit's would."""
        import subprocess
        from collections import deque

        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        from lagdoctor.diagnosis.submit import connect_master, plan_connect
        from lagdoctor.objectstore import airflow_executor, check_deployable
        from lagdoctor.settings import Settings

        with no_retry(ValueError):
            url = SparkConnectHook(conn_id=self._conn_id).get_connection_url()
            settings = Settings.from_env()
            check_deployable(settings.data_root, master=connect_master(url), executor=airflow_executor(),
                             shared=settings.data_root_shared)
            plan = plan_connect(prep, remote=url, connection_conf=_connection_extra(self._conn_id).get("conf"),
                                operator_conf=self.conf, session_conf_dir=private_dir)
        self.log.info("diagnosis on the Spark Connect server %s", url.split(";", 1)[0])  # never its token
        tail: deque[str] = deque(maxlen=40)
        # its own process group, to be stopped whole; it dies with this process (LAGDOCTOR_PARENT_PID)
        self._connect_proc = proc = subprocess.Popen(
            plan.command, env={**plan.env, PARENT_PID_ENV: str(os.getpid())}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            for line in proc.stdout:
                self.log.info("%s", line.rstrip())
                tail.append(line)
            code = proc.wait()
        finally:
            # A timeout (AirflowTaskTimeout) or a kill raised in the loop: Airflow's on_kill comes
            # after this, so the client is stopped here, never left running its queries.
            if proc.poll() is None:
                stop_connect_client(proc)
            self._connect_proc = None
        if code == 0:
            return
        code, line = diagnose_stage.diagnosis_failure_line("".join(tail), exit_code=code, runner="the Connect client")
        if code in (diagnose_stage.DIAGNOSIS_USAGE_EXIT, diagnose_stage.DIAGNOSIS_BAD_INPUT_EXIT):
            raise AirflowFailException(line)
        raise AirflowException(line)

    def on_kill(self) -> None:
        proc = self._connect_proc
        if proc is None:
            super().on_kill()
            return
        stop_connect_client(proc)

    def prepared_hook(self, prep: dict[str, Any], private_dir: str):
        """The provider's hook for `prep` on the connection's master: its spark-binary, conf
        merged (lagdoctor's, the object store's, the connection's `conf` extra,
        LAGDOCTOR_SPARK_CONF, the operator's), no Python path forced on a cluster, and
        secrets in a 0600 properties file in `private_dir`, never on the argv."""
        from lagdoctor.diagnosis.submit import plan_submission
        from lagdoctor.objectstore import airflow_executor, check_deployable, write_properties_file
        from lagdoctor.settings import Settings

        self.conf = self.conf or {}
        self._hook = None
        hook = self._get_hook()
        spark = hook._connection
        extra = _connection_extra(self._conn_id)
        with no_retry(ValueError):
            settings = Settings.from_env()
            data_root = settings.data_root
            check_deployable(data_root, master=spark["master"], executor=airflow_executor(),
                             shared=settings.data_root_shared)
            plan = plan_submission(prep, master=spark["master"], deploy_mode=spark.get("deploy_mode"),
                                   binary_from_connection=bool(extra.get("spark-binary")), data_root=data_root,
                                   connection_conf=extra.get("conf"), operator_conf=self.conf)
        self.application, self.application_args = plan.application, list(prep["args"])
        # The hook was built before the arguments were known: hand them over, or the job gets none.
        hook._application_args = self.application_args
        hook._py_files, hook._conf, hook._env_vars = plan.py_files, plan.conf, plan.env_vars or None
        if plan.spark_binary:
            hook._connection["spark_binary"] = plan.spark_binary
        if plan.secret_conf:
            props = write_properties_file(plan.secret_conf, private_dir)
            build = hook._build_spark_submit_command

            def with_secrets(application: str) -> list[str]:
                # --extra-properties-file: spark-defaults.conf is still read (--properties-file replaces it)
                cmd = build(application)
                return [cmd[0], "--extra-properties-file", props, *cmd[1:]]

            hook._build_spark_submit_command = with_secrets
        return hook

    def _submit(self, context: Any) -> None:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException

        try:
            super().execute(context)
        except AirflowException as exc:
            code, line = diagnose_stage.diagnosis_failure_line(str(exc))
            if code in (diagnose_stage.DIAGNOSIS_USAGE_EXIT, diagnose_stage.DIAGNOSIS_BAD_INPUT_EXIT):
                # Bad arguments or unreadable input: the same run would fail the same way.
                raise AirflowFailException(line) from None
            raise AirflowException(line) from None


def use_data_root(context: Any) -> None:
    """Every task's first step (the DAGs' on_execute_callback): the data root's filesystem
    configured, an s3:// root's credentials read from its Airflow connection, before the
    task body reads the store; a body that reads findings first would go unsigned."""
    from lagdoctor.settings import Settings

    Settings.from_env()


def _params() -> dict[str, Any]:
    return dict(get_current_context()["params"])


def _form() -> dict[str, Any]:
    """The params as validate_params checked them (numbers as numbers, thresholds a dict)."""
    return get_current_context()["ti"].xcom_pull(task_ids=VALIDATE_TASK_ID)


def _run_id() -> str:
    return str(get_current_context()["run_id"])


def _run_key() -> str:
    from lagdoctor.stages.common import run_key

    ctx = get_current_context()
    return run_key(str(ctx["run_id"]), ctx["dag"].dag_id)


def see_shared_root() -> None:
    """With LAGDOCTOR_DATA_ROOT_SHARED=1 under a distributed executor: fail this task in one line
    when its worker does not see the root as the run's first task left it (lagdoctor.mount).
    Retried: the next try may land on a worker that mounts it."""
    from lagdoctor.mount import check_worker_sees
    from lagdoctor.objectstore import airflow_executor
    from lagdoctor.settings import Settings

    check_worker_sees(Settings.from_env(), _run_key(), executor=airflow_executor())


CLUSTERS_TASK_ID = "list_clusters"


def skip_if_late(context: Any, now: datetime | None = None) -> None:
    """A scheduled run that starts when the next is already due skips, saying so in one
    line (also left in XCom for the tasks that run whatever their upstream did); a manual run
    never does. Its tasks end skipped, not failed: no Slack failure message, nothing written."""
    from airflow.sdk.exceptions import AirflowSkipException

    dag_run = context.get("dag_run")
    scheduled_for = getattr(dag_run, "run_after", None)
    run_type = getattr(dag_run, "run_type", None)
    if getattr(run_type, "value", run_type) != "scheduled" or scheduled_for is None:
        return
    start = getattr(dag_run, "data_interval_start", None) or scheduled_for
    end = getattr(dag_run, "data_interval_end", None) or scheduled_for
    next_due = params_stage.next_scheduled_after(context["dag"].timetable, start, end)
    line = params_stage.late_run_line(run_type, scheduled_for, next_due, now or datetime.now(timezone.utc))
    if line:
        log.warning("%s", line)
        context["ti"].xcom_push(key=LATE_RUN_KEY, value=line)
        raise AirflowSkipException(line)


def notify_recovery_unless_skipped(context: Any) -> dict[str, Any]:
    """The sweep's on_success_callback: notify_recovery, unless the run checked nothing.
    Airflow hands a DAG's success callback its last successful task; with none (every task
    skipped: a late run) nothing was read, so nothing can be said to have recovered."""
    from lagdoctor.notify.incidents import notify_recovery

    line = late_run(context)
    if line or not (context.get("ti") or context.get("task_instance")):
        log.info("no recovery message: %s", line or "no task of this run succeeded")
        return {"decision": "unchanged", "undelivered": 0, "delivery_error": None}
    return notify_recovery(context)


def skip_with_late_run(context: Any) -> None:
    """For tasks that run whatever their upstream did (all_done): skipped with a late run too."""
    from airflow.sdk.exceptions import AirflowSkipException

    line = late_run(context)
    if line:
        raise AirflowSkipException(line)


def _narrow_snapshot_timeout(context: Any) -> None:
    """pre_execute: this run's snapshot timeout from its own samples and interval."""
    form = context["ti"].xcom_pull(task_ids=VALIDATE_TASK_ID) or {}
    if form.get("samples"):
        budget = snapshot_timeout(int(form["samples"]), float(form.get("interval_seconds") or 0))
        context["task"].execution_timeout = min(budget, SNAPSHOT_TIMEOUT_CEILING)


def build_pipeline(*, samples: int, interval_s: float, prune: bool, one_thread_per_run: bool = False,
                   approvals: bool | None = None) -> None:
    """Add the shared tasks to the DAG being defined (call inside `with DAG(...)`).

    `approvals`: whether an action that needs approval waits for a human here
    (default: only the manual incident DAG). The sweep proposes instead: it
    runs every few minutes with one active run and must never wait.
    """
    from lagdoctor.runbooks import RunbookError

    approvals = one_thread_per_run if approvals is None else approvals
    kind = "incident" if one_thread_per_run else "sweep"

    @task(task_id=VALIDATE_TASK_ID, execution_timeout=TIMEOUTS["validate_params"])
    def validate_params() -> dict[str, Any]:
        skip_if_late(get_current_context())
        params = {"samples": samples, "interval_seconds": interval_s, **_params()}
        if kind == "incident":
            params.pop("clusters", None)  # an incident looks at its one cluster
        dag_run = get_current_context().get("dag_run")
        from lagdoctor.mount import leave_run_marker
        from lagdoctor.notify.spool import check_shared
        from lagdoctor.objectstore import airflow_executor, check_deployable
        from lagdoctor.settings import Settings

        # before any snapshot lands on one worker's disk that the next task's worker cannot see
        with no_retry(ValueError):  # the settings' own errors (a bad LAGDOCTOR_DATA_ROOT_SHARED) too
            settings = Settings.from_env()
            check_deployable(settings.data_root, executor=airflow_executor(), shared=settings.data_root_shared)
            check_shared(settings, executor=airflow_executor())
        # a declared shared root: what later tasks look for on their own workers (see_shared_root)
        leave_run_marker(settings, _run_key(), executor=airflow_executor())
        with no_retry(params_stage.FormError):
            return params_stage.validate_params(params, conf=getattr(dag_run, "conf", None) or {})

    # What the snapshot maps over: Airflow maps only over a task's whole return value.
    @task(task_id=CLUSTERS_TASK_ID, execution_timeout=TIMEOUTS["list_clusters"])
    def list_clusters(form: dict[str, Any]) -> list[str]:
        return list(form["clusters"])

    # One instance per cluster, each with its own time limit and retries; the
    # grid names each by its connection id.
    @task(task_id=SNAPSHOT_TASK_ID, execution_timeout=SNAPSHOT_TIMEOUT_CEILING, pre_execute=_narrow_snapshot_timeout,
          map_index_template="{{ task.op_kwargs['cluster'] }}")
    def snapshot(cluster: str, form: dict[str, Any]) -> dict[str, Any]:
        # An incident whose pattern selects nothing fails here, before Spark, never "no problem found".
        see_shared_root()
        with no_retry(collect_stage.NoGroupMatched):
            return collect_stage.snapshot_cluster(cluster, _run_id(), form, dag_id=get_current_context()["dag"].dag_id,
                                                  require_match=kind == "incident")

    # After every snapshot is done (retries included), for the clusters that were read.
    # The form comes from XCom: with validate_params upstream, its success alone would
    # satisfy "one success" when every cluster failed.
    @task(execution_timeout=TIMEOUTS["prepare_diagnosis"], trigger_rule="all_done_min_one_success")
    def prepare_diagnosis() -> dict[str, Any]:
        see_shared_root()
        form, ti = _form(), get_current_context()["ti"]
        results = ti.xcom_pull(task_ids=SNAPSHOT_TASK_ID, map_indexes=list(range(len(form["clusters"]))))
        read = collect_stage.snapshotted_clusters(form["clusters"], list(results))
        scoped = kind == "incident"  # a sweep's verdict covers every group; an incident only its own
        prep = diagnose_stage.prepare_diagnosis(
            read, _run_id(), window_minutes=float(form["window_minutes"]), thresholds=form["thresholds"],
            group_pattern=form["group_pattern"] if scoped else None, topic=form["topic"] if scoped else None,
            dag_id=get_current_context()["dag"].dag_id,
        )
        return {**prep, "clusters_unread": [c for c in form["clusters"] if c not in read]}

    diagnose = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis",
                                   execution_timeout=TIMEOUTS["diagnose"])

    @task(task_id=PLAN_TASK_ID, execution_timeout=TIMEOUTS["plan"])
    def plan(prep: dict[str, Any], form: dict[str, Any]) -> dict[str, Any]:
        see_shared_root()
        ctx = get_current_context()
        with no_retry(RunbookError):
            return plan_stage.plan_findings(
                prep["output"], group_pattern=form["group_pattern"], topic=form["topic"],
                dag_id=ctx["dag"].dag_id, run_id=str(ctx["run_id"]), kind=kind,
                threshold_overrides=form["thresholds"], clusters=prep.get("clusters"),
                clusters_unread=prep.get("clusters_unread"),
            )

    # Reads the plan from XCom, not as an argument, and runs whatever Slack did:
    # a Slack outage must not stop remediation. No plan (it failed): no branch.
    @task.branch(trigger_rule="all_done", execution_timeout=TIMEOUTS["route"])
    def route() -> list[str]:
        skip_with_late_run(get_current_context())
        summary = get_current_context()["ti"].xcom_pull(task_ids=PLAN_TASK_ID)
        return plan_stage.choose_branches(summary, approvals=approvals)

    # After the reports (so Slack links them), whether they were written or not: a report
    # that fails or times out must not hold back the findings. No plan: no post.
    @task(task_id=POST_TASK_ID, execution_timeout=TIMEOUTS["post_findings"], trigger_rule="all_done_min_one_success")
    def post_findings(summary: dict[str, Any]) -> dict[str, int]:
        see_shared_root()
        report_error = get_current_context()["ti"].xcom_pull(task_ids=REPORTS_TASK_ID, key=REPORT_ERROR_KEY)
        scope = notify_stage.incident_scope(_form()) if one_thread_per_run else None
        from lagdoctor.notify.spool import SpoolNotShared
        from lagdoctor.objectstore import airflow_executor

        # Undelivered messages wait in the outbox for the next run: retrying now would not help.
        with no_retry(notify_stage.SlackUndelivered, SpoolNotShared):
            return notify_stage.post_findings(summary["plans"], _run_id(), incident_scope=scope,
                                              report_error=report_error, executor=airflow_executor())

    # No retry: a second try would only keep the Slack post waiting longer.
    @task(task_id=REPORTS_TASK_ID, execution_timeout=TIMEOUTS["write_reports"], retries=0)
    def write_reports(prep: dict[str, Any]) -> int:
        ti = get_current_context()["ti"]
        return notify_stage.write_reports(
            prep["output"], on_failure=lambda line: ti.xcom_push(key=REPORT_ERROR_KEY, value=line))

    # Branch tasks (route, gates, approvals) skip what follows them, and the
    # run's state comes from its leaves: so a failure before the branch (Slack,
    # say) would end as a successful run. This task, downstream of every
    # non-branch task, fails the run instead.
    @task(task_id=CHECK_TASK_ID, trigger_rule="one_failed", retries=0, on_failure_callback=None,
          execution_timeout=TIMEOUTS["check_failures"])
    def check_failures() -> None:
        from airflow.sdk.exceptions import AirflowFailException

        ctx = get_current_context()
        ti = ctx["ti"]
        try:
            states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id],
                                        task_ids=sorted(ctx["task"].upstream_task_ids)).get(ti.run_id, {})
        except Exception:  # noqa: BLE001 (the run fails either way; the names are a courtesy)
            states = {}
        clusters = (ti.xcom_pull(task_ids=VALIDATE_TASK_ID) or {}).get("clusters") or []
        raise AirflowFailException(run_failure_line(states, clusters))

    form = validate_params()
    clusters = list_clusters(form)
    snap = snapshot.partial(form=form).expand(cluster=clusters)
    prep = prepare_diagnosis()
    snap >> prep
    summary = plan(prep, form)
    prep >> diagnose >> summary
    reports = write_reports(prep)
    summary >> reports
    posted = post_findings(summary)
    reports >> posted
    # Slack first, then the branch: a branch spares every task downstream of a
    # branch it follows, so the post must not sit between it and the actions.
    branches = route()
    posted >> branches
    checked = [form, clusters, snap, prep, diagnose, summary, reports, posted]

    for action in action_names():
        _remediation_group(action, branches, approvals=approvals)

    if prune:
        # all_done: a cluster that stays unreachable must not stop retention for the others.
        @task(execution_timeout=TIMEOUTS["prune_history"], trigger_rule="all_done")
        def prune_history() -> int:
            skip_with_late_run(get_current_context())
            return housekeeping_stage.prune_history()

        pruned = prune_history()
        snap >> pruned
        checked.append(pruned)

        @task(execution_timeout=TIMEOUTS["compact_history"], trigger_rule="all_done")
        def compact_history() -> dict[str, Any]:
            skip_with_late_run(get_current_context())
            return housekeeping_stage.compact_history()

        compacted = compact_history()
        snap >> compacted
        checked.append(compacted)

    checked >> check_failures()


APPROVAL_FORM_KEY = "approval_form"


class TargetApprovalOperator(HITLOperator):
    """One choice per target: "Approve n: <group> on <cluster> / <topic>" for each target
    the gate found runnable now (tick any), and "Reject all" (the default, also on
    timeout). The options exist only at run time, so they come from the gate's XCom
    when the task starts and again when it resumes with the answer."""

    def __init__(self, *, gate_task_id: str, **kwargs: Any) -> None:
        super().__init__(options=[plan_stage.REJECT_ALL], defaults=[plan_stage.REJECT_ALL], multiple=True,
                         subject="lagdoctor approval", **kwargs)
        self.gate_task_id = gate_task_id
        self.approval_targets: list[dict[str, Any]] = []

    def _load_form(self, context: Any) -> dict[str, Any]:
        form = context["ti"].xcom_pull(task_ids=self.gate_task_id, key=APPROVAL_FORM_KEY) or {}
        self.options = list(form.get("options") or [plan_stage.REJECT_ALL])
        self.subject = form.get("subject") or self.subject
        self.body = form.get("body")
        self.approval_targets = list(form.get("targets") or [])
        return form

    def execute(self, context: Any):
        self._load_form(context)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        self._load_form(context)
        result = super().execute_complete(context, event)
        # Which try answered: `run` must tell a re-run approval's answer from the earlier one's.
        return {**result, "approval_try": int(context["ti"].try_number)} if isinstance(result, dict) else result


def _remediation_group(action: str, branches, *, approvals: bool) -> None:
    """`gate` -> [`approve`] -> `run` for an action that changes state in a DAG that asks
    for approval; `run` alone for advice, and in the sweep (which proposes, never waits)."""
    group_id = plan_stage.action_task_id(action)
    with TaskGroup(group_id=group_id, tooltip=f"remediation: {action}"):
        changes_state = get_action(action).changes_state
        asks = approvals and changes_state

        # `run` must not take the plan as an argument: that would make `plan` an
        # upstream whose success lets it run although its gate was skipped.
        @task(task_id="run", trigger_rule="none_failed_min_one_success", execution_timeout=TIMEOUTS["run"])
        def run() -> dict[str, int]:
            ctx = get_current_context()
            summary = ctx["ti"].xcom_pull(task_ids=PLAN_TASK_ID)
            approval = ctx["ti"].xcom_pull(task_ids=f"{group_id}.approve") if asks else None
            form = ctx["ti"].xcom_pull(task_ids=f"{group_id}.gate", key=APPROVAL_FORM_KEY) if asks else None
            # approved=None where approval is needed and nobody was asked: the runner
            # records it blocked (the gate found every target blocked) or awaiting_approval.
            keys = plan_stage.approved_targets(form, approval.get("chosen_options")) if approval else None
            # Targets the form did not offer (blocked when asked): recorded blocked, never "rejected".
            not_offered = plan_stage.not_offered_targets(form)
            by = approval_meta(approval)
            if by is not None:
                from lagdoctor.notify.approvals import slack_answer

                by = {**by, **slack_answer(ctx["ti"].dag_id, _run_id(), f"{group_id}.approve")}
            try:
                return remediate_stage.remediate(
                    action, summary["plans"], _run_id(), dry_run=bool(ctx["params"]["dry_run"]),
                    approved=None, approved_keys=keys, approval_by=by, not_offered=not_offered,
                )
            except remediate_stage.RemediationBlocked as exc:
                # Blocked is not done: never green. Where a human asked for it (the incident
                # DAG) the run fails; the sweep, where a cooldown is routine, skips it
                # (failed, when it ran for other groups).
                from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

                ctx["ti"].xcom_push(key="blocked", value=str(exc))
                raise (AirflowFailException if exc.changed or asks else AirflowSkipException)(str(exc)) from None

        r = run()
        if not asks:
            branches >> r
            return

        @task.branch(task_id="gate", execution_timeout=TIMEOUTS["gate"])
        def gate() -> str:
            summary = get_current_context()["ti"].xcom_pull(task_ids=PLAN_TASK_ID)
            dry_run = bool(_params()["dry_run"])
            # The guard is evaluated here, before anybody is asked: a target it blocks is
            # not offered, and with every target blocked nobody is asked at all. The form
            # goes to `run` either way: what it showed blocked is recorded blocked there.
            if dry_run:
                return f"{group_id}.run"
            form = plan_stage.approval_form(action, summary["plans"])
            get_current_context()["ti"].xcom_push(key=APPROVAL_FORM_KEY, value=form)
            return f"{group_id}.approve" if any(t["option"] for t in form["targets"]) else f"{group_id}.run"

        approve = TargetApprovalOperator(
            task_id="approve",
            gate_task_id=f"{group_id}.gate",
            response_timeout=APPROVAL_TIMEOUT,
            # asks in the run's Slack thread (a button per target when enabled)
            notifiers=[SlackApprovalNotifier()],
            execution_timeout=TIMEOUTS["approve"],
            retries=0,  # a retry would ask the human again
        )
        g = gate()
        branches >> g
        g >> [approve, r]
        approve >> r


THRESHOLDS_HELP = ('JSON object of diagnosis thresholds to override, e.g. {"warning_lag": 5000, '
                   '"critical_lag": 50000}; {} for none. Checked when the run starts: bad JSON, an unknown '
                   "name or a value that is not a number fails it at once, naming the field.")


def thresholds_param(description: str = THRESHOLDS_HELP):
    """The threshold overrides field: JSON text in a plain text box (default "{}").

    The form picks its widget from the value when the schema has no `type`:
    a string gives a text box that is always there and never disables Trigger
    (the object editor sometimes did not render). `anyOf` still lets API and
    CLI triggers pass a JSON object, as before. validate_params parses and
    checks it (names, numbers) when the run starts.
    """
    from airflow.sdk import Param

    return Param("{}", anyOf=[{"type": "string"}, {"type": "object"}, {"type": "null"}], format="multiline",
                 title="Threshold overrides", description=description)


def clusters_param(default: list[str]):
    """The sweep's cluster list: a JSON array or its text (comma-separated), so the
    form never disables Trigger; validate_params checks each id."""
    from airflow.sdk import Param

    return Param(list(default), type=["array", "string", "null"], title="Clusters",
                 description="Airflow connection ids (type kafka) to sweep, e.g. kafka_eu,kafka_us; "
                             "empty: the `cluster` param. Default from LAGDOCTOR_SWEEP_CLUSTERS.")
