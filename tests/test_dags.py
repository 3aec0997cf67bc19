"""DAG integrity: the DagBag loads, policy holds, and parsing stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lagdoctor.contracts import INCIDENT_DAG_ID, SWEEP_DAG_ID

DAGS = Path(__file__).resolve().parents[1] / "dags"

pytestmark = pytest.mark.airflow


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}


def test_contract_dag_ids_exist(dagbag):
    assert {SWEEP_DAG_ID, INCIDENT_DAG_ID} <= set(dagbag.dag_ids)


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_policy_tags_retries_docs(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert "lagdoctor" in dag.tags
    assert dag.doc_md and dag.catchup is False
    for t in dag.tasks:
        if t.task_type != "ApprovalOperator":  # a human answers approvals; retrying one asks twice
            assert t.retries >= 1, f"{t.task_id} has no retries"


def test_sweep_runs_on_a_five_minute_schedule(dagbag):
    assert dagbag.dags[SWEEP_DAG_ID].schedule == "*/5 * * * *"


def test_incident_form_has_the_contract_params_and_dry_run_by_default(dagbag):
    params = dagbag.dags[INCIDENT_DAG_ID].params
    assert {"cluster", "group_pattern", "topic", "window_minutes", "dry_run"} <= set(params.keys())
    assert params["dry_run"] is True
    assert params["cluster"] == "kafka_default"
    assert dagbag.dags[INCIDENT_DAG_ID].schedule is None  # manual only


def test_incident_form_rejects_bad_input(dagbag):
    from airflow.sdk.definitions.param import ParamsDict

    dag = dagbag.dags[INCIDENT_DAG_ID]
    good = ParamsDict(dag.params)
    good.validate()
    for bad in ({"window_minutes": 0}, {"cluster": ""}, {"dry_run": "nope"}):
        params = ParamsDict(dag.params)
        key, value = next(iter(bad.items()))
        with pytest.raises(Exception):
            params[key] = value
            params.validate()


def test_every_registered_action_has_a_branch(dagbag):
    from lagdoctor.orchestration import branch_target
    from lagdoctor.remediation import action_names

    for dag_id in (SWEEP_DAG_ID, INCIDENT_DAG_ID):
        task_ids = set(dagbag.dags[dag_id].task_ids)
        for action in action_names():
            assert branch_target(action) in task_ids
            assert f"remediate_{action}.run" in task_ids


def test_an_action_runs_only_after_its_gate_or_approval(dagbag):
    """A skipped gate must skip the action: `run` has no other upstream that could succeed."""
    from lagdoctor.remediation import action_names, get_action

    dag = dagbag.dags[INCIDENT_DAG_ID]
    for action in action_names():
        upstream = dag.get_task(f"remediate_{action}.run").upstream_task_ids
        if get_action(action).changes_state:
            assert upstream == {f"remediate_{action}.gate", f"remediate_{action}.approve"}
            assert dag.get_task(f"remediate_{action}.gate").upstream_task_ids == {"route"}
        else:
            assert upstream == {"route"}


def test_slack_is_posted_before_the_branch(dagbag):
    """Airflow spares tasks downstream of a followed branch from skipping: nothing the
    branch always follows may sit between it and the remediation groups."""
    dag = dagbag.dags[INCIDENT_DAG_ID]
    assert "post_findings" in dag.get_task("route").upstream_task_ids


@pytest.mark.parametrize("dag_file", sorted(p.name for p in DAGS.glob("*.py")))
def test_parsing_a_dag_file_imports_no_heavy_library(dag_file):
    """The scheduler parses DAG files constantly: no pyspark, Kafka, Slack or k8s clients at parse time."""
    code = (
        "import runpy, sys, json; runpy.run_path(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in ('pyspark', 'confluent_kafka', 'slack_sdk', 'kubernetes', "
        "'pandas', 'pyarrow') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(DAGS / dag_file)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
