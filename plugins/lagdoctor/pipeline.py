"""The task graph both DAGs share: snapshot -> diagnose -> plan -> branch -> Slack -> remediation.

Only wiring: each task body is a call into `lagdoctor.orchestration`. The
remediation branches come from the actions registered in code, so editing a
runbook never changes the DAG's shape. Run-time values come from the DAG's
params, so the scheduled sweep and a manual incident run share one graph.

    snapshot -> prepare_diagnosis -> diagnose (spark-submit) -> plan -> write_reports -> post_findings -> route
    route -> remediate_<action>.gate -> [remediate_<action>.approve] -> remediate_<action>.run
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import TaskGroup, get_current_context, task

from lagdoctor import orchestration
from lagdoctor.remediation import action_names, approved_from_hitl, get_action

POST_TASK_ID = "post_findings"
PLAN_TASK_ID = "plan"
APPROVAL_TIMEOUT = timedelta(hours=1)


class DiagnoseLagOperator(SparkSubmitOperator):
    """spark-submit of spark_jobs/diagnose_lag.py on the `spark_default` connection.

    Its application, arguments and --py-files zip are built at run time by the
    prepare task (XCom), not at parse time: the scheduler parses DAG files all
    the time and must not build zips or touch the store.
    """

    def __init__(self, *, prepare_task_id: str, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", orchestration.SPARK_CONN_ID)
        kwargs.setdefault("name", "lagdoctor-diagnose-lag")
        super().__init__(application="", **kwargs)
        self.prepare_task_id = prepare_task_id

    def execute(self, context: Any) -> None:
        prep = context["ti"].xcom_pull(task_ids=self.prepare_task_id)
        self.application = prep["application"]
        self.py_files = prep["py_files"]
        self.application_args = list(prep["args"])
        self._spark_binary = prep["spark_submit"]
        self.conf = {
            **(self.conf or {}),
            "spark.pyspark.python": prep["python"],
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{prep['log_config']}",
        }
        self.env_vars = {**(self.env_vars or {}), "PATH": prep["path"], "PYSPARK_PYTHON": prep["python"]}
        super().execute(context)


def _params() -> dict[str, Any]:
    return dict(get_current_context()["params"])


def _run_id() -> str:
    return str(get_current_context()["run_id"])


def build_pipeline(*, samples: int, interval_s: float, prune: bool, one_thread_per_run: bool = False) -> None:
    """Add the shared tasks to the DAG being defined (call inside `with DAG(...)`)."""

    @task
    def snapshot() -> dict[str, Any]:
        p = _params()
        return orchestration.take_snapshots(
            p["cluster"], _run_id(), group_pattern=p.get("group_pattern") or None,
            topic=p.get("topic") or None, samples=int(p.get("samples", samples)),
            interval_s=float(p.get("interval_seconds", interval_s)),
        )

    @task
    def prepare_diagnosis(snap: dict[str, Any]) -> dict[str, Any]:
        p = _params()
        return orchestration.prepare_diagnosis(
            snap["cluster"], _run_id(), window_minutes=float(p["window_minutes"]), thresholds=p.get("thresholds")
        )

    diagnose = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis")

    @task(task_id=PLAN_TASK_ID)
    def plan(prep: dict[str, Any]) -> dict[str, Any]:
        p, ctx = _params(), get_current_context()
        return orchestration.plan_findings(
            prep["output"], group_pattern=p.get("group_pattern") or None, topic=p.get("topic") or None,
            dag_id=ctx["dag"].dag_id, run_id=str(ctx["run_id"]),
        )

    @task.branch
    def route(summary: dict[str, Any]) -> list[str]:
        return orchestration.choose_branches(summary)

    @task(task_id=POST_TASK_ID)
    def post_findings(summary: dict[str, Any]) -> dict[str, int]:
        scope = orchestration.incident_scope(_params()) if one_thread_per_run else None
        return orchestration.post_findings(summary["plans"], _run_id(), incident_scope=scope)

    @task
    def write_reports(prep: dict[str, Any]) -> int:
        return orchestration.write_reports(prep["output"])

    snap = snapshot()
    prep = prepare_diagnosis(snap)
    summary = plan(prep)
    prep >> diagnose >> summary
    reports = write_reports(prep)
    summary >> reports
    posted = post_findings(summary)
    reports >> posted
    # Slack first, then the branch: a branch spares every task downstream of a
    # branch it follows, so the post must not sit between it and the actions.
    branches = route(summary)
    posted >> branches

    for action in action_names():
        _remediation_group(action, branches)

    if prune:
        @task
        def prune_history() -> int:
            return orchestration.prune_history()

        snap >> prune_history()


def _remediation_group(action: str, branches) -> None:
    """`gate` -> [`approve`] -> `run` for an action that changes state; `run` alone for advice."""
    group_id = orchestration.action_task_id(action)
    with TaskGroup(group_id=group_id, tooltip=f"remediation: {action}"):

        # `run` must not take the plan as an argument: that would make `plan` an
        # upstream whose success lets it run although its gate was skipped.
        @task(task_id="run", trigger_rule="none_failed_min_one_success")
        def run() -> dict[str, int]:
            ctx = get_current_context()
            summary = ctx["ti"].xcom_pull(task_ids=PLAN_TASK_ID)
            approval = ctx["ti"].xcom_pull(task_ids=f"{group_id}.approve") if changes_state else None
            return orchestration.remediate(
                action, summary["plans"], _run_id(), dry_run=bool(ctx["params"]["dry_run"]),
                approved=approved_from_hitl(approval) if approval else None,
            )

        changes_state = get_action(action).changes_state
        r = run()
        if not changes_state:
            # Advice only (recommended consumer settings): nothing to approve.
            branches >> r
            return

        @task.branch(task_id="gate")
        def gate() -> str:
            summary = get_current_context()["ti"].xcom_pull(task_ids=PLAN_TASK_ID)
            dry_run = bool(_params()["dry_run"])
            if orchestration.approval_needed(action, summary["plans"], dry_run=dry_run):
                ti = get_current_context()["ti"]
                ti.xcom_push(key="approval_text", value=orchestration.approval_text(action, summary["plans"]))
                return f"{group_id}.approve"
            return f"{group_id}.run"

        approve = ApprovalOperator(
            task_id="approve",
            subject=f"lagdoctor: approve {action}?",
            body=f"{{{{ ti.xcom_pull(task_ids='{group_id}.gate', key='approval_text') }}}}",
            defaults="Reject",
            response_timeout=APPROVAL_TIMEOUT,
        )
        g = gate()
        branches >> g
        g >> [approve, r]
        approve >> r
