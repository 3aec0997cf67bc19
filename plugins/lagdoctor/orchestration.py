"""What the DAG tasks do, one function per task, so DAG files only wire.

Every function is keyed by the run (`run_key`) and safe to retry: a retried
snapshot task finds its samples already written, the diagnosis overwrites its
own run's output, Slack threads and remediation are deduplicated by their
stores. XCom carries paths and small summaries, never snapshot data.

Nothing heavy is imported at module level: DAG files import this module.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.settings import Settings, join

log = logging.getLogger(__name__)

DEFAULT_KAFKA_CONN_ID = "kafka_default"
SPARK_CONN_ID = "spark_default"
SWEEP_WINDOW_MINUTES = 30
SNAPSHOT_RETENTION_DAYS = 7
PLANS_FILE = "plans.json"


def run_key(run_id: str) -> str:
    """A run id made safe for paths and file names, stable across retries."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_")


# -- Kafka ---------------------------------------------------------------------

def kafka_admin(conn_id: str) -> tuple[Any, str]:
    """(AdminClient, bootstrap for messages) from an Airflow `kafka` connection.

    With no such connection, KAFKA_BOOTSTRAP_SERVERS is used, so a bare
    install works against the embedded broker.
    """
    from lagdoctor.connections import connection_exists
    from lagdoctor.kafka_clients import admin_client, resolve_bootstrap

    if connection_exists(conn_id):
        from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook

        hook = KafkaAdminClientHook(kafka_config_id=conn_id)
        bootstrap = hook.get_connection(conn_id).extra_dejson.get("bootstrap.servers", conn_id)
        return hook.get_conn, str(bootstrap)
    try:
        bootstrap = resolve_bootstrap(None)
    except ValueError:
        raise ValueError(
            f"no Airflow connection {conn_id!r} of type kafka, and KAFKA_BOOTSTRAP_SERVERS is not set"
        ) from None
    return admin_client(bootstrap), bootstrap


def take_snapshots(
    conn_id: str,
    run_id: str,
    *,
    group_pattern: str | None = None,
    topic: str | None = None,
    samples: int = 1,
    interval_s: float = 5.0,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Collect `samples` snapshots `interval_s` apart into the store; idempotent per run."""
    import pyarrow.compute as pc

    from lagdoctor.collector import collect_snapshot
    from lagdoctor.store import write_snapshot

    settings = settings or Settings.from_env()
    admin, bootstrap = kafka_admin(conn_id)
    key = run_key(run_id)
    written, rows = [], 0
    for i in range(samples):
        started = time.monotonic()
        now = datetime.now(timezone.utc)
        table = collect_snapshot(admin, conn_id, group_pattern, now, bootstrap=bootstrap)
        if topic:
            table = table.filter(pc.equal(table["topic"], topic))
        path = write_snapshot(table, settings.snapshots_root, conn_id, now, key=f"{key}-{i}")
        if path is None:
            log.info("sample %d of run %s was already written; not sampling again", i, run_id)
        else:
            written.append(path)
            rows += table.num_rows
            log.info("sample %d/%d: %d rows -> %s", i + 1, samples, table.num_rows, path)
        if i + 1 < samples:
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return {"cluster": conn_id, "store": settings.snapshots_root, "files": len(written), "rows": rows}


def prune_history(keep_days: int = SNAPSHOT_RETENTION_DAYS, settings: Settings | None = None) -> int:
    """Retention: snapshot days and per-run findings/report folders older than `keep_days`."""
    import fsspec

    from lagdoctor.store import prune_snapshots

    settings = settings or Settings.from_env()
    now = datetime.now(timezone.utc)
    removed = prune_snapshots(settings.snapshots_root, keep_days, now)
    cutoff = now.timestamp() - keep_days * 86400
    for root in (settings.findings_root, settings.reports_root):
        fs, path = fsspec.core.url_to_fs(root)
        if not fs.exists(path):
            continue
        for run_dir in fs.ls(path, detail=True):
            if run_dir["type"] != "directory":
                continue
            stamps = [f.get("mtime") or f.get("LastModified") for f in fs.ls(run_dir["name"], detail=True)]
            newest = max((s.timestamp() if hasattr(s, "timestamp") else float(s) for s in stamps if s), default=None)
            if newest is not None and newest < cutoff:
                fs.rm(run_dir["name"], recursive=True)
                removed.append(run_dir["name"])
    for path in removed:
        log.info("retention: removed %s", path)
    return len(removed)


# -- Spark -----------------------------------------------------------------------

def check_thresholds(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Threshold overrides from a run's params, checked before any Spark time is spent."""
    from lagdoctor.diagnosis.thresholds import Thresholds

    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(Thresholds.field_names()))
    if unknown:
        raise ValueError(
            f"unknown threshold(s) {', '.join(unknown)}; known: {', '.join(Thresholds.field_names())}"
        )
    try:
        Thresholds.from_overrides(overrides)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad threshold value: {exc}") from None
    return overrides


def prepare_diagnosis(
    cluster: str,
    run_id: str,
    *,
    window_minutes: float,
    thresholds: Mapping[str, Any] | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Arguments for the SparkSubmitOperator, built at run time (the package zip too)."""
    import os
    import sys
    from pathlib import Path

    from lagdoctor.diagnosis.submit import build_package_zip, default_job_script, job_arguments, quiet_log_config

    settings = settings or Settings.from_env()
    work_dir = Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "lagdoctor-spark"
    output = join(settings.findings_root, run_key(run_id))
    snapshots = join(settings.snapshots_root, f"cluster={cluster}")
    bindir = str(Path(sys.executable).parent)
    return {
        "application": default_job_script(),
        "py_files": build_package_zip(work_dir),
        "args": job_arguments(snapshots, output, window_minutes=window_minutes,
                              thresholds=check_thresholds(thresholds)),
        "output": output,
        "python": sys.executable,
        "spark_submit": str(Path(bindir) / "spark-submit"),
        "path": bindir + os.pathsep + os.environ.get("PATH", ""),
        "log_config": quiet_log_config(work_dir),
    }


# -- findings and runbooks ---------------------------------------------------------

def _read_jsonl(path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_findings(output: str) -> list[dict[str, Any]]:
    """The run's findings, each with its partitions' status rows as evidence."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.notify.render import with_partition_status

    status_rows = _read_jsonl(join(output, PARTITION_STATUS_FILE))
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in status_rows:
        by_key.setdefault((row["cluster"], row["group_id"], row["topic"]), []).append(row)
    return [
        with_partition_status(f, by_key.get((f["cluster"], f["group_id"], f["topic"]), []))
        for f in _read_jsonl(join(output, FINDINGS_FILE))
    ]


RUN_FILE = "run.json"


def plan_findings(
    output: str,
    *,
    group_pattern: str | None = None,
    topic: str | None = None,
    runbooks_dir: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Pair each finding with its runbook plan; write them, and which DAG run
    produced them (run.json: the lag page links back to it), beside the findings.

    Returns a small summary: counts and, per registered action, how many
    findings want it (the branch task reads this).
    """
    import fsspec

    from lagdoctor.runbooks import choose_actions, load_runbooks

    pattern = re.compile(group_pattern) if group_pattern else None
    findings = [
        f for f in read_findings(output)
        if (pattern is None or pattern.fullmatch(f["group_id"])) and (not topic or f["topic"] == topic)
    ]
    runbooks = load_runbooks(runbooks_dir)
    planned = [{"finding": f, "plan": choose_actions(f, runbooks).as_dict()} for f in findings]
    plans_path = join(output, PLANS_FILE)
    with fsspec.open(plans_path, "wt") as fh:
        json.dump(planned, fh)
    with fsspec.open(join(output, RUN_FILE), "wt") as fh:
        json.dump({"dag_id": dag_id, "run_id": run_id, "planned_at": datetime.now(timezone.utc).isoformat(),
                   "group_pattern": group_pattern, "topic": topic}, fh)
    wanted: dict[str, int] = {}
    for item in planned:
        for action in item["plan"]["actions"]:
            wanted[action["action"]] = wanted.get(action["action"], 0) + 1
    by_severity: dict[str, int] = {}
    for f in findings:
        by_severity[f["severity"]] = by_severity.get(f["severity"], 0) + 1
    return {
        "plans": plans_path,
        "findings": len(findings),
        "problems": sum(1 for f in findings if f["diagnosis"] != "healthy"),
        "by_severity": by_severity,
        "actions": wanted,
    }


def read_plans(plans_path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(plans_path, "rt") as fh:
        return json.load(fh)


def action_task_id(action: str) -> str:
    return f"remediate_{action}"


def branch_target(action: str) -> str:
    """The first task of an action's group: its approval gate, or its run for advice-only actions."""
    from lagdoctor.remediation import get_action

    step = "gate" if get_action(action).changes_state else "run"
    return f"{action_task_id(action)}.{step}"


def choose_branches(summary: Mapping[str, Any]) -> list[str]:
    """Branch targets: one remediation group per action some finding's runbook chose."""
    from lagdoctor.remediation import action_names

    known = set(action_names())
    return [branch_target(a) for a in sorted(a for a in summary.get("actions", {}) if a in known)]


def write_reports(output: str) -> int:
    """One HTML report per problem (linked from Slack when LAGDOCTOR_REPORT_BASE_URL is set)."""
    from lagdoctor.web.report import write_incident_report

    try:
        paths = write_incident_report(output)
    except Exception as exc:  # a report is an extra: it must never hold back the Slack post
        log.error("could not write the incident reports: %s", " ".join(str(exc).split()))
        return 0
    for path in paths:
        log.info("report: %s", path)
    return len(paths)


# -- Slack ---------------------------------------------------------------------------

def post_findings(
    plans_path: str, run_id: str, *, incident_scope: str | None = None, settings: Settings | None = None
) -> dict[str, int]:
    """Tell Slack. A sweep posts, updates or closes each incident key's own thread;
    a manual incident run (`incident_scope` set) keeps the whole run in one thread.
    Both are deduplicated by their stores, so a retried task posts nothing twice."""
    from lagdoctor.notify.incidents import post_incident_run, post_or_update_incident

    items = read_plans(plans_path)
    if incident_scope is not None:
        result = post_incident_run(items, run_id=run_id, scope=incident_scope, settings=settings)
        return {"problems": result["problems"], "findings": result["findings"]}
    decisions: dict[str, int] = {}
    for item in items:
        result = post_or_update_incident(item["finding"], item["plan"], run_id=run_id, settings=settings)
        decisions[result["decision"]] = decisions.get(result["decision"], 0) + 1
    log.info("slack: %s", decisions)
    return decisions


def incident_scope(params: Mapping[str, Any]) -> str:
    """How an incident run names what it looked at, e.g. `kafka_default / orders-.* / orders`."""
    parts = [str(params.get("cluster", "")), str(params.get("group_pattern") or ".*")]
    if params.get("topic"):
        parts.append(str(params["topic"]))
    return " / ".join(parts)


# -- remediation ------------------------------------------------------------------------

def approval_needed(action: str, plans_path: str, *, dry_run: bool) -> bool:
    """Whether a human must approve `action` for this run: never on a dry run."""
    from lagdoctor.remediation import needs_approval

    if dry_run:
        return False
    return any(
        needs_approval(action, dry_run=False, guardrails=planned.get("guardrails"))
        for item in read_plans(plans_path)
        for planned in item["plan"]["actions"]
        if planned["action"] == action
    )


def approval_text(action: str, plans_path: str) -> str:
    """The body shown on the approval form: what would be done, to which groups."""
    lines = [f"lagdoctor proposes `{action}` for:"]
    for item in read_plans(plans_path):
        if any(a["action"] == action for a in item["plan"]["actions"]):
            f = item["finding"]
            lines.append(f"- {f['cluster']} / {f['group_id']} / {f['topic']}: {f['summary']}")
    return "\n".join(lines)


def remediate(
    action: str,
    plans_path: str,
    run_id: str,
    *,
    dry_run: bool,
    approved: bool | None = None,
    settings: Settings | None = None,
) -> dict[str, int]:
    """Run one registered action for every finding that wants it; report each in its thread."""
    from lagdoctor.notify.incidents import post_action_result
    from lagdoctor.remediation import RemediationFailed, run_action

    statuses: dict[str, int] = {}
    failures: list[str] = []
    for item in read_plans(plans_path):
        for planned in item["plan"]["actions"]:
            if planned["action"] != action:
                continue
            try:
                record = run_action(
                    action, item["finding"], run_id=run_id, dry_run=dry_run, approved=approved,
                    params=planned.get("params") or {}, guardrails=planned.get("guardrails") or {},
                    settings=settings,
                )
            except RemediationFailed as exc:
                # One group's failure must not stop the action for the others;
                # the runner has audited it and the task fails at the end.
                failures.append(f"{item['finding']['group_id']}: {exc}")
                statuses["failed"] = statuses.get("failed", 0) + 1
                continue
            post_action_result(record, settings=settings)
            statuses[record["status"]] = statuses.get(record["status"], 0) + 1
    log.info("%s: %s", action, statuses)
    if failures:
        raise RemediationFailed(f"{action} failed for {len(failures)} group(s); first: {failures[0]}")
    return statuses
