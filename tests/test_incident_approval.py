"""Outside a dry run, an action that needs approval waits for a human in Airflow,
and does exactly what the answer says: a restart on Approve, nothing on Reject."""

from __future__ import annotations

import json
import re

import pytest

from lagdoctor.contracts import INCIDENT_DAG_ID
from tests.fixtures.airflow import answer_approval

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.airflow]

APPROVAL_TASK = "remediate_restart_consumers.approve"


def remediation_config(group, k8s_server, **extra):
    return json.dumps({
        "require_approval": ["restart_consumers"],
        "deployments": {group: {"namespace": "mail", "name": "mailer"}},
        "kubernetes": {"host": k8s_server.url},
        **extra,
    })


@pytest.fixture
def real_run_env(monkeypatch, kafka_bootstrap, k8s_server, crashed_group, tmp_path, warm_engine):
    _, group = crashed_group
    k8s_server.add_deployment("mail", "mailer", replicas=2)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", remediation_config(group, k8s_server))
    return tmp_path / "data"


def approval_shown(run) -> tuple[str, str]:
    """(subject, body) of the approval form as the Airflow UI showed it."""
    from airflow.models.hitl import HITLDetail
    from airflow.utils.session import create_session
    from sqlalchemy import select

    ti = run.get_task_instance(APPROVAL_TASK)
    with create_session() as session:
        detail = session.scalars(select(HITLDetail).where(HITLDetail.ti_id == ti.id)).one()
        return detail.subject, detail.body


def approve_first(options):
    return [options[0]]


@pytest.mark.parametrize("answer, restarted", [(approve_first, True), ("Reject all", False)])
def test_restart_waits_for_approval_and_follows_the_answer(
    airflow_db, incident_dag, real_run_env, crashed_group, k8s_server, answer, restarted
):
    from airflow.utils.state import DagRunState, TaskInstanceState
    from markdown_it import MarkdownIt

    topic, group = crashed_group
    answerer = answer_approval(INCIDENT_DAG_ID, APPROVAL_TASK, answer)
    try:
        run = incident_dag.test(run_conf={
            "group_pattern": re.escape(group), "samples": 3, "interval_seconds": 1, "window_minutes": 30,
            "dry_run": False,
        })
    finally:
        answerer.stop()
    assert run.state == DagRunState.SUCCESS
    assert answerer.error is None, answerer.error
    assert answerer.answered, "the approval task never waited for a human"
    # One choice per target, and Reject all.
    option = f"Approve 1: {group} on kafka_default / {topic}"
    assert answerer.options == [option, "Reject all"]

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["remediate_restart_consumers.gate"] == TaskInstanceState.SUCCESS
    # The branch ran only what the crashed group's runbook chose.
    assert states["remediate_scale_consumers.gate"] == TaskInstanceState.SKIPPED
    assert states["remediate_add_partitions.gate"] == TaskInstanceState.SKIPPED
    # The form named the concrete change, its target and why.
    subject, body = approval_shown(run)
    assert subject == f"lagdoctor: rollout restart mail/mailer (group {group} on kafka_default)?"
    html = MarkdownIt("commonmark").render(body)  # as the Airflow UI shows it
    assert (f"Approve 1: <strong>{group}</strong> on kafka_default, topic {topic}: rollout restart mail/mailer"
            in html)
    assert "target: Deployment mail/mailer" in html and "why: crashed_consumer: " in html
    patches = [r for r in k8s_server.requests if r.method == "PATCH"]
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.settings import Settings

    audit = list(ActionLog.from_settings(Settings(data_root=str(real_run_env))).records())
    assert states["remediate_restart_consumers.run"] == TaskInstanceState.SUCCESS
    # who answered in Airflow is in the action log (the lag page's timeline shows it)
    assert {r["approval"]["by"] for r in audit} == {"oncall"}
    if restarted:
        assert len(patches) == 1 and "restartedAt" in json.dumps(patches[0].body)
        # Audited write-ahead: "started" before the call, then its outcome.
        assert [(r["action"], r["status"], r["dry_run"]) for r in audit] == [
            ("restart_consumers", "started", False), ("restart_consumers", "executed", False)]
        assert all(r["approval"]["chosen"] == [option] and r["approval"]["at"] for r in audit)
    else:
        assert patches == []
        assert [(r["action"], r["status"]) for r in audit] == [("restart_consumers", "rejected")]


def test_when_the_guard_blocks_every_target_nobody_is_asked_and_the_run_fails(
    airflow_db, incident_dag, real_run_env, crashed_group, k8s_server, slack_connection, monkeypatch
):
    from airflow.utils.state import DagRunState, TaskInstanceState

    _, group = crashed_group
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", remediation_config(group, k8s_server, deny_groups=[group]))
    answerer = answer_approval(INCIDENT_DAG_ID, APPROVAL_TASK, "Reject all", timeout_s=300)
    try:
        run = incident_dag.test(run_conf={
            "group_pattern": re.escape(group), "samples": 3, "interval_seconds": 1, "window_minutes": 30,
            "dry_run": False,
        })
    finally:
        answerer.stop()
    assert answerer.error is None, answerer.error
    assert not answerer.answered, "a human was asked to approve what the guard blocks"

    reason = f"deny_list: group matches deny pattern '{group}'"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states[APPROVAL_TASK] == TaskInstanceState.SKIPPED
    # Blocked is not done: the run task fails, and the run with it.
    ran = run.get_task_instance("remediate_restart_consumers.run")
    assert ran.state == TaskInstanceState.FAILED
    assert run.state == DagRunState.FAILED
    assert ran.xcom_pull(task_ids=ran.task_id, key="blocked") == (
        f"restart_consumers blocked for 1 of 1 group(s), not run: group {group} on kafka_default: "
        f"not offered for approval, blocked when asked: {reason}")
    assert [r for r in k8s_server.requests if r.method == "PATCH"] == []
    assert any(reason in json.dumps(m) for m in slack_connection.messages)


def test_an_approved_action_its_guard_blocks_after_the_approval_fails_the_run_and_says_who_approved(
    airflow_db, incident_dag, real_run_env, crashed_group, k8s_server, slack_connection, monkeypatch
):
    import os

    from airflow.utils.state import DagRunState, TaskInstanceState

    _, group = crashed_group

    def deny_meanwhile():  # the guard changes while the human reads the form
        os.environ["LAGDOCTOR_REMEDIATION_CONFIG"] = remediation_config(group, k8s_server, deny_groups=[group])

    answerer = answer_approval(INCIDENT_DAG_ID, APPROVAL_TASK, approve_first, before_answer=deny_meanwhile)
    try:
        run = incident_dag.test(run_conf={
            "group_pattern": re.escape(group), "samples": 3, "interval_seconds": 1, "window_minutes": 30,
            "dry_run": False,
        })
    finally:
        answerer.stop()
    assert answerer.error is None, answerer.error
    assert answerer.answered

    reason = f"deny_list: group matches deny pattern '{group}'"
    ran = run.get_task_instance("remediate_restart_consumers.run")
    assert ran.state == TaskInstanceState.FAILED and run.state == DagRunState.FAILED
    assert reason in ran.xcom_pull(task_ids=ran.task_id, key="blocked")
    assert [r for r in k8s_server.requests if r.method == "PATCH"] == []
    # Slack says it was blocked, and who had approved it.
    blocked = [m for m in slack_connection.messages if reason in json.dumps(m)]
    assert blocked and "Approved in Airflow by oncall" in json.dumps(blocked)
