"""Faults at the stages layer (lagdoctor.stages), met the way a user meets them: through
`dag.test()` with a run's form, or the task functions the DAGs call.

Each test asserts what the on-call engineer sees (one line naming the field,
the task states in the grid, the Slack text) and that nothing was lost or done
twice. dag.test() runs are few: the form faults stop in the first task (about
a second each); one run goes through spark-submit with Slack down.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from lagdoctor.settings import Settings
from lagdoctor.stages.collect import take_snapshots
from lagdoctor.stages.common import run_key
from lagdoctor.stages.diagnose import prepare_diagnosis
from lagdoctor.stages.notify import SlackUndelivered, post_findings
from lagdoctor.stages.params import validate_params
from lagdoctor.stages.plan import plan_findings

pytestmark = [pytest.mark.airflow]


def _record_failures(dag) -> list[tuple[str, str, str]]:
    """(task_id, exception type, message) of every task failure in the next dag.test()."""
    seen: list[tuple[str, str, str]] = []

    def record(context) -> None:
        exc = context.get("exception")
        seen.append((context["ti"].task_id, type(exc).__name__, str(exc)))

    for t in dag.tasks:
        t.on_failure_callback = [record]
    return seen


@pytest.fixture
def form_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:9"}}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    return tmp_path / "data"


BAD_FORMS = [
    pytest.param({"group_pattern": "("}, r"^invalid group_pattern regex '\(': ", id="regex that does not compile"),
    pytest.param({"group_pattern": "(a+)+$" * 200}, r"^invalid group_pattern regex .*1,?000",
                 id="pattern over 1,000 chars"),
    pytest.param({"thresholds": {"warn_lag": 10}}, r"^thresholds\.warn_lag: unknown threshold; known: warning_lag, ",
                 id="unknown threshold"),
    pytest.param({"thresholds": {"warning_lag": "abc"}}, r"^thresholds\.warning_lag: expected a number, got 'abc'$",
                 id="threshold not a number"),
    pytest.param({"thresholds": '{"warning_lag": "abc"}'}, r"^thresholds\.warning_lag: expected a number",
                 id="threshold as JSON text"),
    pytest.param({"thresholds": '{"warning_lag": 5000'}, r"^thresholds: not valid JSON \(.+ at character \d+\)$",
                 id="threshold text that is not JSON"),
    pytest.param({"thresholds": '{"warn_lag": 5000}'}, r"^thresholds\.warn_lag: unknown threshold; known: ",
                 id="unknown threshold in JSON text"),
    pytest.param({"thresholds": '[5000]'}, r"^thresholds: expected a JSON object like \{\"warning_lag\": 5000\}, "
                 r"got list$", id="threshold text not an object"),
    pytest.param({"cluster": "prod_eu"}, r"^cluster: no Airflow connection 'prod_eu' of type kafka$",
                 id="missing connection"),
]


@pytest.mark.parametrize("conf, line", BAD_FORMS)
def test_a_bad_form_fails_in_the_first_task_once_with_one_line(airflow_db, incident_dag, form_env, conf, line):
    from airflow.utils.state import DagRunState, TaskInstanceState

    failures = _record_failures(incident_dag)
    started = time.monotonic()
    run = incident_dag.test(run_conf={"samples": 1, "interval_seconds": 0, **conf})
    assert run.state == DagRunState.FAILED
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert tis["validate_params"].state == TaskInstanceState.FAILED
    assert tis["validate_params"].try_number == 1  # not retried: a retry cannot fix the form
    assert tis["snapshot"].state == TaskInstanceState.UPSTREAM_FAILED
    assert tis["diagnose"].state == TaskInstanceState.UPSTREAM_FAILED
    # Nothing was snapshotted, diagnosed or planned.
    assert not list(form_env.glob("snapshots/**/*.parquet"))
    assert not list(form_env.glob("findings/*"))
    (task_id, kind, message), *_ = failures
    assert (task_id, kind) == ("validate_params", "AirflowFailException")
    assert re.search(line, message), message
    assert "\n" not in message and len(message) < 1000
    assert time.monotonic() - started < 60  # no retry delay was waited


def test_a_catastrophic_pattern_is_accepted_and_matches_as_it_should(kafka_bootstrap, unique, tmp_path, monkeypatch):
    """`(a+)+$` over a 31-character group id took 160 s per sample with backtracking;
    RE2 answers at once. The result is asserted, not the time."""
    from lagdoctor.lab.workload import commit_offsets, create_topic, produce_counts

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    settings = Settings(data_root=str(tmp_path))
    topic = unique("evil")
    suffix = re.sub(r"[^a]", "a", unique("x").lower())  # unique per session, still all a's
    matching, evil = "a" * 30 + suffix, "a" * 30 + suffix + "!"
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 5})
    for group in (matching, evil):
        commit_offsets(kafka_bootstrap, group, topic, {0: 2})

    form = validate_params({"cluster": "kafka_default", "group_pattern": "(a+)+$", "topic": topic,
                                          "samples": 1, "interval_seconds": 0, "window_minutes": 30})
    assert form["group_pattern"] == "(a+)+$"
    snap = take_snapshots("kafka_default", "manual__evil", group_pattern=form["group_pattern"],
                                        topic=topic, samples=1, interval_s=0, settings=settings)
    import pyarrow.dataset as ds

    groups = set(ds.dataset(str(tmp_path / "snapshots"), format="parquet").to_table().column("group_id").to_pylist())
    assert snap["rows"] >= 1 and groups == {matching}

    # plan_findings filters a job's findings by the same pattern, in the same engine.
    output = tmp_path / "findings" / "run"
    output.mkdir(parents=True)
    rows = [{"cluster": "kafka_default", "group_id": g, "topic": topic, "partitions": [], "diagnosis": "healthy",
             "pattern": "flat", "severity": "ok", "summary": "keeps up", "evidence": {},
             "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"} for g in (matching, evil)]
    (output / "findings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (output / "partition_status.jsonl").write_text("")
    summary = plan_findings(str(output), group_pattern="(a+)+$", topic=topic, kind="incident")
    planned = json.loads(Path(summary["plans"]).read_text())
    assert [p["finding"]["group_id"] for p in planned] == [matching]


@pytest.mark.parametrize("run_id", ["..", ".", "a/../b", "a/../../b", "../../etc"])
def test_hostile_run_ids_keep_every_output_inside_its_root(run_id, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    settings = Settings(data_root=str(tmp_path / "data"))
    prep = prepare_diagnosis("kafka_default", run_id, window_minutes=30, dag_id="kafka_lag_incident",
                                           settings=settings)
    output = Path(prep["output"])
    findings_root = (tmp_path / "data" / "findings").resolve()
    assert output.resolve().parent == findings_root
    assert prep["args"][prep["args"].index("--output") + 1] == prep["output"]
    # Two hostile ids never share a folder with an honest one.
    assert output.name != run_key("b", "kafka_lag_incident")


def _plans(folder: Path, findings: list[dict]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plans.json"
    path.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}} for f in findings]))
    return str(path)


@pytest.mark.parametrize("executor, spool_dir, refused", [
    ("CeleryExecutor", None, "CeleryExecutor"),
    ("airflow.providers.cncf.kubernetes.executors.kubernetes_executor.KubernetesExecutor", None,
     "KubernetesExecutor"),
    ("CeleryExecutor", "shared/spool", None),  # the operator's folder that every worker mounts
    ("LocalExecutor", None, None),  # one host: the default spool, as before
], ids=["celery", "kubernetes", "celery-shared-spool", "local"])
def test_a_spool_on_one_workers_disk_under_a_distributed_executor_is_refused_before_anything_is_posted(
        slack_connection, tmp_path, monkeypatch, executor, spool_dir, refused):
    """A call spooled on one worker's disk dies with a Kubernetes pod, or is replayed by one Celery worker
    after the others moved on: post_findings refuses that spool in one line, before posting anything."""
    from lagdoctor.notify.spool import SpoolNotShared

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    settings = Settings(data_root=str(tmp_path / "data"), spool_dir=spool_dir and str(tmp_path / spool_dir))
    plans = _plans(tmp_path / "data" / "findings" / "sweep-1", [
        {"cluster": "prod", "group_id": "orders", "topic": "orders", "partitions": [0], "diagnosis": "slow_consumer",
         "pattern": "steady_climb", "severity": "warning", "summary": "lag climbs", "evidence": {"lag": 5000},
         "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"}])
    if refused is None:
        assert post_findings(plans, "scheduled__1", settings=settings, executor=executor) == {"posted": 1}
        assert len(slack_connection.posts) == 1
        return
    with pytest.raises(SpoolNotShared) as err:
        post_findings(plans, "scheduled__1", settings=settings, executor=executor)
    line = str(err.value)
    assert line == (f"LAGDOCTOR_SPOOL_DIR is not set, so the Slack spool is on this worker's disk "
                    f"({settings.spool_root}), but Airflow runs tasks with the {refused}, whose hosts share no disk: "
                    f"set LAGDOCTOR_SPOOL_DIR to a folder every worker mounts (NFS, EFS, a ReadWriteMany volume)")
    assert slack_connection.requests == []


def test_slack_down_queues_everything_then_says_so_in_one_line(slack_connection, tmp_path, monkeypatch):
    """A sweep's post with Slack answering 500: every message is kept, the task says how many, in one line;
    once Slack is back, each goes out exactly once."""
    from lagdoctor.notify.incidents import deliver_pending

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    settings = Settings(data_root=str(tmp_path / "data"))
    findings = [{"cluster": "prod", "group_id": f"orders-{i}", "topic": "orders", "partitions": [0],
                 "diagnosis": "slow_consumer", "pattern": "steady_climb", "severity": "warning",
                 "summary": f"lag climbs on orders-{i}", "evidence": {"lag": 5000},
                 "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"} for i in range(2)]
    run_dir = tmp_path / "data" / "findings" / "sweep-1"
    plans = _plans(run_dir, findings)
    (run_dir / "quarantined.jsonl").write_text(json.dumps(
        {"path": "/data/snapshots/cluster=prod/date=2026-11-21/bad.parquet", "moved_to": "/data/_quarantine/bad.parquet",
         "reason": "not a Parquet file"}) + "\n")

    slack_connection.fail_all(500)
    with pytest.raises(SlackUndelivered) as err:
        post_findings(plans, "scheduled__1", settings=settings)
    message = str(err.value)
    assert re.fullmatch(r"Slack: 3 message\(s\) not delivered, kept in the outbox: .+", message), message
    assert "\n" not in message and "xoxb-" not in message
    assert slack_connection.posts == []
    # One round of slack-sdk's retries for the whole task, not one per message:
    # a sweep with many findings must not spend its time limit on a dead Slack.
    attempts = [r for r in slack_connection.requests if r.method == "chat.postMessage"]
    assert len(attempts) == 1 + 2  # the first send and ServerErrorRetryHandler's two retries

    slack_connection.heal()
    assert deliver_pending(settings)["undelivered"] == 0
    texts = [json.dumps(m) for m in slack_connection.messages]
    assert len(texts) == 3
    assert sum("bad.parquet" in t and "not a Parquet file" in t for t in texts) == 1
    assert sum("orders-0" in t for t in texts) == 1 and sum("orders-1" in t for t in texts) == 1
    # A retried task posts nothing twice.
    assert post_findings(plans, "scheduled__1", settings=settings)
    assert len(slack_connection.posts) == 3


@pytest.mark.broker
@pytest.mark.spark
def test_slack_down_fails_the_run_but_remediation_still_decides(
    airflow_db, incident_dag, kafka_bootstrap, crashed_group, slack_connection, warm_engine, tmp_path, monkeypatch
):
    from airflow.utils.state import DagRunState, TaskInstanceState

    from lagdoctor.notify.incidents import deliver_pending

    topic, group = crashed_group
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    failures = _record_failures(incident_dag)
    slack_connection.fail_all(500)
    run = incident_dag.test(run_conf={"group_pattern": re.escape(group), "topic": topic, "samples": 3,
                                      "interval_seconds": 1, "window_minutes": 30, "dry_run": True})

    assert run.state == DagRunState.FAILED
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["post_findings"] == TaskInstanceState.FAILED
    assert states["route"] == TaskInstanceState.SUCCESS  # not upstream_failed: remediation does not wait on Slack
    assert states["remediate_restart_consumers.run"] == TaskInstanceState.SUCCESS
    assert states["check_failures"] == TaskInstanceState.FAILED
    post = [m for t, _, m in failures if t == "post_findings"]
    assert len(post) == 1 and re.fullmatch(r"Slack: \d+ message\(s\) not delivered, kept in the outbox: .+", post[0])
    assert any(t == "check_failures" and "post_findings" in m for t, _, m in failures)

    # run.json says what this run was: an incident, scoped, no overrides.
    (run_json,) = (tmp_path / "data").glob("findings/*/run.json")
    meta = json.loads(run_json.read_text())
    assert meta["kind"] == "incident" and meta["group_pattern"] == re.escape(group) and meta["topic"] == topic
    assert meta["threshold_overrides"] == {}
    assert run_json.parent.name.startswith("kafka_lag_incident__")

    # Nothing was lost: once Slack is back, the finding and the remediation decision (blocked here:
    # no Deployment is mapped) go out, once each.
    slack_connection.heal()
    deliver_pending(Settings(data_root=str(tmp_path / "data")))
    texts = [json.dumps(m) for m in slack_connection.messages]
    results = [m["text"] for m in slack_connection.messages if m["text"].startswith("restart_consumers ")]
    assert len(results) == 1 and group in results[0], results
    assert sum("Crashed consumer" in t and group in t for t in texts) >= 1


def _report_raises(*args, **kwargs):
    raise OSError("reports store full")


def _report_hangs(*args, **kwargs):
    time.sleep(120)  # the task's short time limit ends it


@pytest.mark.broker
@pytest.mark.spark
@pytest.mark.parametrize("writer, reason", [
    pytest.param(_report_raises, r"OSError: reports store full", id="report writer raises"),
    pytest.param(_report_hangs, r"AirflowTaskTimeout", id="report writer times out"),
])
def test_a_failed_report_still_lets_the_findings_reach_slack(
    airflow_db, incident_dag, kafka_bootstrap, crashed_group, slack_connection, warm_engine, tmp_path, monkeypatch,
    caplog, writer, reason,
):
    from datetime import timedelta

    from airflow.utils.state import DagRunState, TaskInstanceState

    topic, group = crashed_group
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setattr("lagdoctor.web.report.write_incident_report", writer)
    incident_dag.get_task("write_reports").execution_timeout = timedelta(seconds=3)
    failures = _record_failures(incident_dag)
    # Three samples: fewer is collecting history (rule case 28), a crash on it only provisional.
    run = incident_dag.test(run_conf={"group_pattern": re.escape(group), "topic": topic, "samples": 3,
                                      "interval_seconds": 1, "window_minutes": 30, "dry_run": True})

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["write_reports"] == TaskInstanceState.FAILED
    assert states["post_findings"] == TaskInstanceState.SUCCESS
    # The findings went out, in the run's thread.
    assert any(group in json.dumps(p.body) and "Crashed consumer" in json.dumps(p.body) for p in slack_connection.posts)
    # The report's failure is not hidden: its task failed with the reason, and the run failed naming it.
    report = [(kind, message) for t, kind, message in failures if t == "write_reports"]
    assert len(report) == 1 and re.search(reason, ": ".join(report[0])), report
    assert run.state == DagRunState.FAILED
    assert any(t == "check_failures" and "write_reports" in m for t, _, m in failures)
    # ... and the post's task says once why the findings came without report links.
    said = [r.getMessage() for r in caplog.records if r.funcName == "post_findings"
            and r.getMessage().startswith("report not written: ")]
    assert len(said) == 1 and re.search(reason, said[0]), said
