"""Issue 9: one sweep covers every configured cluster.

The form takes a list of cluster connections; each cluster is snapshotted by
its own mapped task instance; one Spark job diagnoses the clusters that were
read; a cluster that cannot be read fails its own instance, named, without
stopping the others, and is never reported healthy. What is asserted is what
the on-call engineer sees: the grid's task states, the lines in the task
failures and in Slack, the files in the store.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from lagdoctor.settings import Settings
from lagdoctor.stages.collect import ClusterUnreadable, snapshot_cluster
from lagdoctor.stages.diagnose import prepare_diagnosis
from lagdoctor.stages.params import FormError, sweep_clusters_default, validate_params
from lagdoctor.stages.plan import plan_findings
from lagdoctor.stages.remediate import remediate

pytestmark = pytest.mark.airflow
DAGS = Path(__file__).resolve().parents[1] / "dags"
DOWN = "127.0.0.1:1"  # nothing listens there: an unreachable cluster


def kafka_conn(monkeypatch, conn_id: str, bootstrap: str) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}))
    return conn_id


@pytest.fixture
def two_conns(monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    return kafka_conn(monkeypatch, "kafka_eu", "10.0.0.1:9092"), kafka_conn(monkeypatch, "kafka_us", "10.0.0.2:9092")


def parse_sweep():
    """A freshly parsed sweep: its `clusters` default is read at parse time, and
    dag.test() leaves a run's conf behind in the DAG object's params."""
    from airflow.dag_processing.dagbag import DagBag

    from lagdoctor.contracts import SWEEP_DAG_ID

    bag = DagBag(dag_folder=str(DAGS / f"{SWEEP_DAG_ID}.py"))
    assert bag.import_errors == {}
    return bag.dags[SWEEP_DAG_ID]


# -- the form ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [["kafka_eu", "kafka_us"], "kafka_eu,kafka_us", '["kafka_eu"]', "", [], None])
def test_the_clusters_field_takes_a_list_its_text_or_nothing(dagbag, value):
    """The trigger form must accept each shape; validate_params checks the ids."""
    from airflow.sdk.definitions.param import ParamsDict

    from lagdoctor.contracts import SWEEP_DAG_ID

    params = ParamsDict(dagbag.dags[SWEEP_DAG_ID].params)
    params["clusters"] = value
    params.validate()


@pytest.mark.parametrize("clusters, conf, expected", [
    (["kafka_eu", "kafka_us"], None, ["kafka_eu", "kafka_us"]),
    ("kafka_eu, kafka_us", None, ["kafka_eu", "kafka_us"]),  # text, as typed in the form
    ("kafka_eu\nkafka_us", None, ["kafka_eu", "kafka_us"]),  # one per line
    ('["kafka_us", "kafka_eu"]', None, ["kafka_us", "kafka_eu"]),  # JSON text keeps its order
    (["kafka_eu", " kafka_eu", "kafka_us", "kafka_eu"], None, ["kafka_eu", "kafka_us"]),  # duplicates dropped
    ("", None, ["kafka_us"]),  # empty: the single `cluster`, as before issue 9
    ([], None, ["kafka_us"]),
    (None, None, ["kafka_us"]),
    # A run's conf that names only `cluster` (API, CLI -c) sweeps that one, not the default list.
    (["kafka_eu"], {"cluster": "kafka_us"}, ["kafka_us"]),
    # ... but a list in the conf wins over it.
    (["kafka_eu"], {"cluster": "kafka_us", "clusters": ["kafka_eu"]}, ["kafka_eu"]),
])
def test_which_clusters_a_run_covers(two_conns, clusters, conf, expected):
    form = validate_params({"cluster": "kafka_us", "clusters": clusters}, conf=conf)
    assert form["clusters"] == expected
    assert form["cluster"] == expected[0]


@pytest.mark.parametrize("clusters, line", [
    (["kafka_eu", "prod_ap"], "clusters: no Airflow connection 'prod_ap' of type kafka"),
    ("kafka_eu,prod_ap,kafka_us", "clusters: no Airflow connection 'prod_ap' of type kafka"),
    ("[\"kafka_eu\", ", "clusters: not valid JSON"),
    ([3], "clusters: expected connection ids (text), got 3"),
    ({"a": 1}, "clusters: expected a list of connection ids"),
])
def test_a_bad_cluster_id_fails_the_form_in_one_line_naming_it(two_conns, clusters, line):
    with pytest.raises(FormError) as err:
        validate_params({"cluster": "kafka_eu", "clusters": clusters})
    assert str(err.value).startswith(line), str(err.value)
    assert "\n" not in str(err.value)


def test_an_id_of_another_type_is_named_with_the_field_it_came_from(two_conns, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG", json.dumps({"conn_type": "postgres", "host": "db"}))
    with pytest.raises(FormError, match=r"^clusters: connection 'pg' is of type 'postgres'"):
        validate_params({"cluster": "kafka_eu", "clusters": ["kafka_eu", "pg"]})
    with pytest.raises(FormError, match=r"^cluster: connection 'pg' is of type 'postgres'"):
        validate_params({"cluster": "pg", "clusters": ""})


def test_the_incident_dag_keeps_its_single_cluster(two_conns):
    """The incident form has no `clusters`; the shared validation gives its one cluster."""
    form = validate_params({"cluster": "kafka_us", "group_pattern": "orders-.*"})
    assert form["clusters"] == ["kafka_us"] and form["cluster"] == "kafka_us"


def test_scheduled_runs_take_the_list_from_the_environment(two_conns, monkeypatch):
    assert sweep_clusters_default({"LAGDOCTOR_SWEEP_CLUSTERS": "kafka_eu, kafka_us,"}) == [
        "kafka_eu", "kafka_us"]
    assert sweep_clusters_default({}) == []
    monkeypatch.setenv("LAGDOCTOR_SWEEP_CLUSTERS", "kafka_us,kafka_eu")
    dag = parse_sweep()
    assert dag.params["clusters"] == ["kafka_us", "kafka_eu"]  # shown in the form, used by the schedule
    form = validate_params({**dag.params, "samples": 1})
    assert form["clusters"] == ["kafka_us", "kafka_eu"]


# -- the graph -------------------------------------------------------------------------------


@pytest.mark.parametrize("dag_id", ["kafka_lag_health_sweep", "kafka_lag_incident"])
def test_the_snapshot_is_mapped_over_the_checked_clusters(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    snap = dag.get_task("snapshot")
    assert type(snap).__name__.endswith("MappedOperator")
    assert {"validate_params", "list_clusters"} <= snap.upstream_task_ids
    assert snap.retries >= 1 and snap.execution_timeout is not None  # each cluster its own
    prep = dag.get_task("prepare_diagnosis")
    # Every snapshot done, at least one read: one unreadable cluster does not stop the others.
    assert prep.trigger_rule == "all_done_min_one_success"
    assert prep.upstream_task_ids == {"snapshot"}
    assert "snapshot" in dag.get_task("check_failures").upstream_task_ids
    if dag_id == "kafka_lag_health_sweep":
        assert dag.get_task("prune_history").trigger_rule == "all_done"
        assert "clusters" in dag.params and "LAGDOCTOR_SWEEP_CLUSTERS" in dag.doc_md


def test_check_failures_names_a_failed_cluster():
    from lagdoctor.stages.common import failed_task_label

    clusters = ["kafka_eu", "kafka_us"]
    assert failed_task_label("snapshot_1", clusters) == "snapshot[kafka_us]"
    assert failed_task_label("post_findings", clusters) == "post_findings"
    assert failed_task_label("snapshot_7", clusters) == "snapshot[7]"


# -- one Spark job -----------------------------------------------------------------------------


def test_one_diagnosis_names_every_cluster_read(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    settings = Settings(data_root=str(tmp_path / "data"))
    prep = prepare_diagnosis(["kafka_eu", "kafka_us", "kafka_eu"], "scheduled__1", window_minutes=30,
                                           dag_id="kafka_lag_health_sweep", settings=settings)
    args = prep["args"]
    assert args[args.index("--snapshots") + 1] == settings.snapshots_root
    assert args[args.index("--clusters") + 1] == "kafka_eu,kafka_us"
    assert prep["clusters"] == ["kafka_eu", "kafka_us"]
    # One cluster reads its own folder, exactly as before issue 9.
    one = prepare_diagnosis(["kafka_eu"], "scheduled__1", window_minutes=30,
                                          dag_id="kafka_lag_health_sweep", settings=settings)["args"]
    assert one[one.index("--snapshots") + 1] == settings.snapshots_root + "/cluster=kafka_eu"
    assert "--clusters" not in one


def test_the_run_says_which_clusters_it_could_not_read(tmp_path):
    output = tmp_path / "findings" / "run"
    output.mkdir(parents=True)
    finding = {"cluster": "kafka_eu", "group_id": "g", "topic": "t", "partitions": [], "diagnosis": "healthy",
               "pattern": "flat", "severity": "ok", "summary": "keeps up", "evidence": {},
               "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"}
    (output / "findings.jsonl").write_text(json.dumps(finding) + "\n")
    (output / "partition_status.jsonl").write_text("")
    summary = plan_findings(str(output), clusters=["kafka_eu"], clusters_unread=["kafka_us"])
    assert summary["clusters_unread"] == ["kafka_us"]
    meta = json.loads((output / "run.json").read_text())
    assert meta["clusters"] == ["kafka_eu"] and meta["clusters_unread"] == ["kafka_us"]


# -- Slack: which cluster failed ---------------------------------------------------------------


class MappedTI:
    def __init__(self, task_id: str, run_id: str, map_index: int, rendered: str | None) -> None:
        self.dag_id, self.task_id, self.run_id = "kafka_lag_health_sweep", task_id, run_id
        self.map_index, self.rendered_map_index = map_index, rendered


@pytest.fixture
def slack_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    return Settings.from_env()


def test_two_clusters_down_are_both_named_once_in_the_failure_thread(slack_settings, slack_connection):
    """Two clusters failing in every run: the thread names each (cluster ids with digits
    included), then counts, instead of replying each run as they alternate."""
    from lagdoctor.notify.incidents import notify_failure

    def fail(run: str, i: int, cluster: str) -> str:
        reason = ClusterUnreadable(f"cluster {cluster}: cannot reach Kafka at 10.0.0.{i}:9092: timed out")
        return notify_failure({"ti": MappedTI("snapshot", run, i, cluster), "run_id": run, "exception": reason},
                              settings=slack_settings)["decision"]

    assert [fail("r1", 1, "kafka_eu1"), fail("r1", 2, "kafka_eu2")] == ["posted", "replied"]
    assert [fail("r2", 1, "kafka_eu1"), fail("r2", 2, "kafka_eu2")] == ["unchanged", "unchanged"]
    root, reply = slack_connection.posts
    assert "snapshot[kafka_eu1]" in root.body["text"] and "cluster kafka_eu1: cannot reach Kafka" in json.dumps(
        root.body["blocks"])
    assert reply.body["thread_ts"] == root.ts and "snapshot[kafka_eu2]" in reply.body["text"]


# -- on the broker -----------------------------------------------------------------------------


@pytest.mark.broker
def test_an_unreachable_cluster_fails_alone_and_a_retry_writes_nothing_twice(
        kafka_bootstrap, crashed_group, tmp_path, monkeypatch):
    topic, group = crashed_group
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    good = kafka_conn(monkeypatch, "kafka_good", kafka_bootstrap)
    down = kafka_conn(monkeypatch, "kafka_down", DOWN)
    settings = Settings(data_root=str(tmp_path))
    form = {"group_pattern": re.escape(group), "topic": topic, "samples": 2, "interval_seconds": 0}

    first = snapshot_cluster(good, "scheduled__1", form, dag_id="sweep", settings=settings)
    with pytest.raises(ClusterUnreadable) as err:
        snapshot_cluster(down, "scheduled__1", form, dag_id="sweep", settings=settings)
    message = str(err.value)
    assert message.startswith(f"cluster {down}: cannot reach Kafka at {DOWN}") and "\n" not in message
    # The down cluster's retry does not touch the good one's samples; the good one's retry writes none.
    with pytest.raises(ClusterUnreadable):
        snapshot_cluster(down, "scheduled__1", form, dag_id="sweep", settings=settings)
    again = snapshot_cluster(good, "scheduled__1", form, dag_id="sweep", settings=settings)
    assert (first["files"], again["files"], again["already_written"]) == (2, 0, 2)
    assert len(list((tmp_path / "snapshots" / f"cluster={good}").rglob("*.parquet"))) == 2
    assert not (tmp_path / "snapshots" / f"cluster={down}").exists()


@pytest.mark.broker
def test_a_findings_remediation_uses_its_own_clusters_connection(kafka_bootstrap, unique, tmp_path, monkeypatch):
    """A run over two clusters: the action for a finding on the second one must build its
    client from the second one's connection, never the run's first cluster's."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from lagdoctor.remediation import kafka_ops

    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    monkeypatch.delenv("LAGDOCTOR_REMEDIATION_CONFIG", raising=False)
    first = kafka_conn(monkeypatch, "kafka_first", DOWN)  # the run's first cluster: never asked
    second = kafka_conn(monkeypatch, "kafka_second", kafka_bootstrap)
    topic = unique("grow")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(timeout=30)

    asked: list[str] = []
    real = kafka_ops.kafka_config_for
    monkeypatch.setattr(kafka_ops, "kafka_config_for", lambda conn_id, *a, **k: asked.append(conn_id) or real(conn_id))
    finding = {"cluster": second, "group_id": unique("g"), "topic": topic, "partitions": [0],
               "diagnosis": "producer_surge", "pattern": "steady_climb", "severity": "warning",
               "summary": "outpaced", "evidence": {}, "window_start": "2026-11-21T10:00:00Z",
               "window_end": "2026-11-21T10:30:00Z"}
    plans = tmp_path / "data" / "findings" / "run" / "plans.json"
    plans.parent.mkdir(parents=True)
    # total = the current count: the real run resolves and applies against the cluster, and changes nothing.
    plans.write_text(json.dumps([{"finding": finding, "plan": {"actions": [
        {"action": "add_partitions", "params": {"total": 1}}], "next_steps": []}}]))
    settings = Settings(data_root=str(tmp_path / "data"))
    statuses = remediate("add_partitions", str(plans), "scheduled__1", dry_run=False, approved=True,
                                       settings=settings)
    assert statuses == {"noop": 1}
    assert asked == [second] and first not in asked


@pytest.mark.broker
@pytest.mark.spark
def test_a_sweep_over_three_clusters_one_unreachable(
        airflow_db, kafka_bootstrap, crashed_group, slack_connection, warm_engine, tmp_path, monkeypatch):
    """Two clusters read (both on the test broker, under two connection ids) and one that
    cannot be: each is its own snapshot instance, the two read are diagnosed in one job,
    the third fails alone, named, and the run ends failed."""
    from airflow.utils.state import DagRunState, TaskInstanceState

    from lagdoctor.notify.incidents import notify_failure

    topic, group = crashed_group
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    monkeypatch.delenv("LAGDOCTOR_SWEEP_CLUSTERS", raising=False)
    a, b = kafka_conn(monkeypatch, "kafka_a", kafka_bootstrap), kafka_conn(monkeypatch, "kafka_b", kafka_bootstrap)
    down = kafka_conn(monkeypatch, "kafka_down", DOWN)
    data = tmp_path / "data"
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(data))

    dag = parse_sweep()
    failures: list[tuple[str, str]] = []

    def record(context) -> None:
        ti = context["ti"]
        failures.append((f"{ti.task_id}[{ti.map_index}]", str(context.get("exception"))))

    for t in dag.tasks:
        t.on_failure_callback = [record, notify_failure]
    dag.get_task("snapshot").retry_delay = timedelta(0)  # the retry, without waiting a minute

    # Three samples: fewer is collecting history (rule case 28), and the crash would only be provisional.
    run = dag.test(run_conf={"clusters": f"{a},{down},{b}", "group_pattern": re.escape(group), "topic": topic,
                             "samples": 3, "interval_seconds": 1, "window_minutes": 30, "dry_run": True})
    assert run.state == DagRunState.FAILED
    tis = run.get_task_instances()
    snaps = {ti.rendered_map_index or ti.map_index: ti for ti in tis if ti.task_id == "snapshot"}
    assert {k: v.state for k, v in snaps.items()} == {
        a: TaskInstanceState.SUCCESS, down: TaskInstanceState.FAILED, b: TaskInstanceState.SUCCESS}
    assert snaps[down].try_number == 2  # retried once, as any other cluster would be
    states = {ti.task_id: ti.state for ti in tis if ti.task_id != "snapshot"}
    for task_id in ("prepare_diagnosis", "diagnose", "plan", "post_findings", "remediate_restart_consumers.run"):
        assert states[task_id] == TaskInstanceState.SUCCESS, task_id
    assert states["check_failures"] == TaskInstanceState.FAILED

    # One diagnosis, of the two clusters read.
    prep = next(ti for ti in tis if ti.task_id == "prepare_diagnosis").xcom_pull(task_ids="prepare_diagnosis")
    assert prep["args"][prep["args"].index("--clusters") + 1] == f"{a},{b}"
    assert prep["clusters_unread"] == [down]
    (findings_file,) = data.glob("findings/*/findings.jsonl")
    findings = [json.loads(line) for line in findings_file.read_text().splitlines()]
    assert {f["cluster"] for f in findings if f["group_id"] == group} == {a, b}
    assert down not in {f["cluster"] for f in findings}  # unknown: no verdict at all, never healthy

    # Snapshots under both clusters read, once each (a retry wrote nothing twice); none for the third.
    for cluster in (a, b):
        assert len(list((data / "snapshots" / f"cluster={cluster}").rglob("*.parquet"))) == 3
    assert not (data / "snapshots" / f"cluster={down}").exists()

    # Each cluster's finding got its own remediation decision.
    from lagdoctor.remediation.audit import ActionLog

    records = list(ActionLog.from_settings(Settings(data_root=str(data))).records())
    assert {r["cluster"] for r in records if r["group_id"] == group} == {a, b}

    # What people see: the failed instance names the cluster; so do check_failures and Slack.
    (snap_failure,) = [m for t, m in failures if t.startswith("snapshot[")]  # the last try's, once
    assert snap_failure.startswith(f"cluster {down}: cannot reach Kafka at {DOWN}") and "\n" not in snap_failure
    check = [m for t, m in failures if t.startswith("check_failures")]
    assert check and f"snapshot[{down}]" in check[0]
    failure_posts = [p for p in slack_connection.posts if "failed: task" in json.dumps(p.body)]
    assert failure_posts and f"snapshot[{down}]" in failure_posts[0].body["text"]
    assert f"cluster {down}: cannot reach Kafka" in json.dumps(failure_posts[0].body["blocks"])
    assert not any("recovered" in json.dumps(p.body) and down in json.dumps(p.body) for p in slack_connection.posts)


# -- a one-minute sweep: a run that starts when the next is due skips (issue 20) ----------------


def test_a_scheduled_run_skips_once_the_next_is_due_and_a_manual_run_never_does():
    from datetime import datetime, timezone

    from lagdoctor.stages.params import late_run_line

    at = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)
    due = datetime(2026, 11, 27, 10, 1, tzinfo=timezone.utc)
    assert late_run_line("scheduled", at, due, datetime(2026, 11, 27, 10, 0, 59, tzinfo=timezone.utc)) is None
    line = late_run_line("scheduled", at, due, datetime(2026, 11, 27, 10, 3, 30, tzinfo=timezone.utc))
    assert line == ("skipped: this scheduled run starts 210 s after its time (2026-11-27 10:00:00 UTC), past the "
                    "next run's (10:01:00 UTC); nothing snapshotted, diagnosed or posted, the next run covers it")
    for run_type in ("manual", "asset_triggered", "backfill"):
        assert late_run_line(run_type, at, due, datetime(2026, 11, 28, tzinfo=timezone.utc)) is None


def test_the_sweeps_next_run_is_due_a_minute_later(dagbag):
    from datetime import datetime, timezone

    from lagdoctor.contracts import SWEEP_DAG_ID
    from lagdoctor.stages.params import next_scheduled_after

    timetable = dagbag.dags[SWEEP_DAG_ID].timetable
    at = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)
    # the interval a scheduled run covers: [10:00, 10:00] for a cron trigger, [9:59, 10:00] with data intervals
    start = at - timedelta(minutes=1) if type(timetable).__name__ == "CronDataIntervalTimetable" else at
    assert next_scheduled_after(timetable, start, at) == datetime(2026, 11, 27, 10, 1, tzinfo=timezone.utc)


@pytest.fixture
def as_scheduled(monkeypatch):
    """dag.test() creates manual runs only: this makes its run the scheduler's kind."""
    import airflow.models.dagrun as dagrun_module
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    def scheduled(*, dag, run_id, logical_date, data_interval, run_after, conf, triggered_by,
                  triggering_user_name, start_date, session):
        return dag.create_dagrun(
            run_id=dagrun_module.DagRun.generate_run_id(run_type=DagRunType.SCHEDULED, logical_date=logical_date,
                                                        run_after=run_after),
            logical_date=logical_date, data_interval=data_interval, run_after=run_after, conf=conf,
            run_type=DagRunType.SCHEDULED, state=DagRunState.RUNNING, triggered_by=triggered_by,
            triggering_user_name=triggering_user_name, start_date=start_date, session=session)

    monkeypatch.setattr(dagrun_module, "get_or_create_dagrun", scheduled)


def test_a_late_scheduled_sweep_skips_every_task_writes_nothing_and_posts_nothing(
        airflow_db, as_scheduled, slack_connection, tmp_path, monkeypatch, caplog):
    """A scheduled run due at 10:00 that starts hours later: the next was due at 10:01, so it
    skips in its first task with one line, every task skipped (none failed), no file in the
    data root, no Slack post; an open failure thread is not told "recovered"."""
    from datetime import datetime, timezone

    from airflow.utils.state import DagRunState, TaskInstanceState

    from lagdoctor.notify.incidents import notify_failure

    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    monkeypatch.delenv("LAGDOCTOR_SWEEP_CLUSTERS", raising=False)
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    kafka_conn(monkeypatch, "kafka_default", DOWN)  # never contacted: the run skips before any read
    # an earlier run failed: its failure thread is open, and the state database holds it
    notify_failure({"ti": MappedTI("snapshot", "scheduled__earlier", 0, "kafka_default"), "run_id": "scheduled__earlier",
                    "exception": ClusterUnreadable("cluster kafka_default: cannot reach Kafka at 10.0.0.1:9092")},
                   settings=Settings.from_env())
    assert len(slack_connection.posts) == 1
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "data").rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*") if p.is_file()}

    dag = parse_sweep()
    due = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)
    with caplog.at_level("WARNING"):
        run = dag.test(logical_date=due, run_after=due)
    assert run.state == DagRunState.SUCCESS
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert set(states.values()) == {TaskInstanceState.SKIPPED}, states
    assert {"validate_params", "snapshot", "diagnose", "post_findings", "route", "prune_history",
            "compact_history", "check_failures"} <= set(states)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped: this scheduled run")]
    assert lines and "after its time (2026-11-27 10:00:00 UTC), past the next run's (10:01:00 UTC)" in lines[0]
    assert lines[0].endswith("the next run covers it") and "\n" not in lines[0]
    assert len(slack_connection.posts) == 1  # nothing posted: no finding, no failure, no "recovered"
    after = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert after == before  # no snapshot, findings, report, pruning or compaction
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_a_manual_sweep_for_a_past_time_is_never_skipped(airflow_db, tmp_path, monkeypatch):
    """Triggered by a person for a time long past: it runs (here its form fails, named)."""
    from datetime import datetime, timezone

    from airflow.utils.state import TaskInstanceState

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("LAGDOCTOR_SWEEP_CLUSTERS", raising=False)
    due = datetime(2026, 11, 27, 10, 0, tzinfo=timezone.utc)
    run = parse_sweep().test(logical_date=due, run_after=due, run_conf={"cluster": "kafka_nowhere"})
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert tis["validate_params"].state == TaskInstanceState.FAILED  # the form was checked: not skipped
    assert tis["validate_params"].xcom_pull(task_ids="validate_params", key="late_run") is None
