"""DAG integrity: the DagBag loads, policy holds, and parsing stays cheap."""

from __future__ import annotations

import copy
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
        # A human answers approvals (retrying one asks twice); check_failures only reports others' failures;
        # a report's retry would only keep the Slack post waiting (issue 19).
        if t.task_type != "TargetApprovalOperator" and t.task_id not in ("check_failures", "write_reports"):
            assert t.retries >= 1, f"{t.task_id} has no retries"
    assert dag.get_task("write_reports").retries == 0


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_every_task_has_a_time_limit(dagbag, dag_id):
    """A stuck task (spark-submit waiting for resources, a hung broker) must not hold the DAG forever."""
    from datetime import timedelta

    for t in dagbag.dags[dag_id].tasks:
        assert t.execution_timeout is not None, f"{t.task_id} has no execution_timeout"
        assert t.execution_timeout <= timedelta(hours=1), t.task_id
    assert dagbag.dags[dag_id].get_task("diagnose").execution_timeout == timedelta(minutes=30)


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_every_task_configures_the_data_root_before_its_body(dagbag, dag_id, monkeypatch):
    """On workers that share no disk the data root is s3://: a task whose body reads the store
    before anything built Settings had no credentials (the topology's `plan` failed on it)."""
    from lagdoctor import objectstore
    from lagdoctor.pipeline import use_data_root

    for t in dagbag.dags[dag_id].tasks:
        callbacks = t.on_execute_callback if isinstance(t.on_execute_callback, list) else [t.on_execute_callback]
        assert use_data_root in callbacks, f"{t.task_id} reads the store unconfigured"
    configured = []
    monkeypatch.setattr(objectstore, "configure_for", lambda root, env=None: configured.append(root))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", "s3://bucket/lagdoctor")
    use_data_root({})
    assert configured == ["s3://bucket/lagdoctor"]


def test_snapshot_time_limit_follows_samples_and_interval():
    from datetime import timedelta

    from lagdoctor.pipeline import SNAPSHOT_TIMEOUT_CEILING, snapshot_timeout

    assert snapshot_timeout(3, 10) == timedelta(seconds=3 * 10 + 3 * 30 + 60)
    assert snapshot_timeout(60, 15) <= SNAPSHOT_TIMEOUT_CEILING  # the largest form allowed


def test_concurrency_and_callbacks(dagbag):
    from lagdoctor.notify.incidents import notify_recovery, notify_run_failed, record_task_failure
    from lagdoctor.pipeline import notify_recovery_unless_skipped

    sweep, incident = dagbag.dags[SWEEP_DAG_ID], dagbag.dags[INCIDENT_DAG_ID]
    assert sweep.max_active_runs == 1 and sweep.catchup is False  # sweeps never pile up
    assert 1 < incident.max_active_runs <= 5
    # a sweep that skipped itself for starting late checked nothing: it says nothing recovered
    assert sweep.on_success_callback in (notify_recovery_unless_skipped, [notify_recovery_unless_skipped])
    assert incident.on_success_callback in (notify_recovery, [notify_recovery])
    for dag in (sweep, incident):
        # a task's failure is remembered; the run's failure is what Slack hears of
        assert dag.default_args["on_failure_callback"] is record_task_failure
        assert dag.on_failure_callback in (notify_run_failed, [notify_run_failed])


def test_the_sweep_never_waits_for_a_human(dagbag):
    """max_active_runs=1: one approval wait would stop every later sweep."""
    sweep = dagbag.dags[SWEEP_DAG_ID]
    assert [t.task_id for t in sweep.tasks if t.task_type == "TargetApprovalOperator"] == []
    assert [t for t in dagbag.dags[INCIDENT_DAG_ID].tasks if t.task_type == "TargetApprovalOperator"]


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_the_form_is_checked_first(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    first = [t.task_id for t in dag.tasks if not t.upstream_task_ids]
    assert first == ["validate_params"]
    assert "validate_params" in dag.get_task("snapshot").upstream_task_ids


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_remediation_does_not_depend_on_slack(dagbag, dag_id):
    """route runs whatever post_findings did; check_failures still fails the run afterwards."""
    dag = dagbag.dags[dag_id]
    route = dag.get_task("route")
    assert route.trigger_rule == "all_done"
    assert route.upstream_task_ids == {"post_findings"}
    check = dag.get_task("check_failures")
    assert check.trigger_rule == "one_failed"
    assert "post_findings" in check.upstream_task_ids
    # A branch skips the tasks right after it: check_failures must follow none of them.
    branchy = {t.task_id for t in dag.tasks if t.task_id == "route" or t.task_id.endswith((".gate", ".approve"))}
    assert not check.upstream_task_ids & branchy


@pytest.mark.parametrize("value", [{}, {"warning_lag": 5000}, '{"warning_lag": 5000}', "", None, "{not json"])
def test_threshold_field_takes_an_object_or_its_text(dagbag, value):
    """The form never disables Trigger: any text passes here (validate_params checks it when the
    run starts), and API/CLI triggers may still send a JSON object."""
    for dag_id in (SWEEP_DAG_ID, INCIDENT_DAG_ID):
        # What a trigger does with its conf (a copy: the session's DagBag stays as parsed).
        params = copy.deepcopy(dagbag.dags[dag_id].params)
        params["thresholds"] = value
        params.validate()


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_threshold_field_is_a_json_text_box(dagbag, dag_id):
    """The form picks its widget from the schema's `type`, else from the value: no `type` and
    the text "{}" give a plain text area, never the object editor that sometimes did not render."""
    param = dagbag.dags[dag_id].params.get_param("thresholds")
    assert param.value == "{}"
    assert "type" not in param.schema and param.schema.get("format") == "multiline"
    assert '{"warning_lag": 5000' in param.description and "fails it at once" in param.description


@pytest.mark.parametrize("dag_id", [SWEEP_DAG_ID, INCIDENT_DAG_ID])
def test_group_pattern_help_says_full_match_with_an_example(dagbag, dag_id):
    help_text = dagbag.dags[dag_id].params.get_param("group_pattern").description
    assert "full match (RE2)" in help_text
    assert "orders-.*" in help_text and "orders-processor" in help_text


def test_sweep_runs_every_minute_unless_the_environment_says_otherwise(dagbag, monkeypatch):
    assert dagbag.dags[SWEEP_DAG_ID].schedule == "* * * * *"
    monkeypatch.setenv("LAGDOCTOR_SWEEP_SCHEDULE", "*/5 * * * *")
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags" / f"{SWEEP_DAG_ID}.py"))
    assert bag.dags[SWEEP_DAG_ID].schedule == "*/5 * * * *"


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
    from lagdoctor.remediation import action_names
    from lagdoctor.stages.plan import branch_target

    for dag_id, approvals in ((SWEEP_DAG_ID, False), (INCIDENT_DAG_ID, True)):
        task_ids = set(dagbag.dags[dag_id].task_ids)
        for action in action_names():
            assert branch_target(action, approvals=approvals) in task_ids
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


@pytest.mark.parametrize("host, input_bytes, c1", [("local[2]", 900_000, True), ("local[2]", 263 * 2**20, False),
                                                    ("local[2]", None, False), ("spark://spark-master", 900_000, False)])
def test_diagnosis_jvm_options_follow_the_spark_connection(monkeypatch, tmp_path, host, input_bytes, c1):
    """The spark-submit the DAG runs: the quiet log config always, C1 only for a small window's
    input on a local master (a big or unknown one keeps C2: 10M rows run 87 s with it, 139 s without)."""
    from lagdoctor.pipeline import DiagnoseLagOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host, "port": 7077}
                                                                if not c1 else {"conn_type": "spark", "host": host}))
    op = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis")
    log_config = str(tmp_path / "log4j2.properties")
    prep = {"application": "job.py", "py_files": "lagdoctor.zip", "args": ["--snapshots", str(tmp_path), "--output",
            str(tmp_path / "out")], "python": "/venv/bin/python", "spark_submit": "/venv/bin/spark-submit",
            "path": "/venv/bin", "log_config": log_config, "input_bytes": input_bytes}
    # a remote master (a host with a port is one) needs a shared data root: refused otherwise
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", "hdfs://nn/lagdoctor")
    cmd = op.prepared_hook(prep, str(tmp_path))._build_spark_submit_command("job.py")
    (options,) = [a.split("=", 1)[1] for a in cmd if a.startswith("spark.driver.extraJavaOptions=")]
    assert f"-Dlog4j2.configurationFile=file:{log_config}" in options
    assert ("-XX:TieredStopAtLevel=1" in options) is c1


def test_the_backtest_dag_is_manual_one_run_at_a_time_and_its_form_has_every_field(dagbag):
    """Issue 33: triggered by hand with a form; one Spark job of many sweeps at a time; a failed
    backtest is not retried (it changes nothing, and a retry would rerun hours of replay)."""
    dag = dagbag.dags["kafka_lag_backtest"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # schedule=None: by hand only
    assert dag.max_active_runs == 1 and "lagdoctor" in dag.tags and dag.doc_md
    assert set(dag.params) == {"from", "to", "step_minutes", "window_minutes", "thresholds", "group_pattern",
                               "topic", "clusters", "as_swept"}
    (task,) = dag.tasks
    assert task.retries == 0
