"""Task-level behaviour that needs no broker or Spark: retention, branching, scopes."""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.settings import Settings
from lagdoctor.stages.common import run_key
from lagdoctor.stages.diagnose import diagnosis_failure_line
from lagdoctor.stages.housekeeping import compact_history, prune_history
from lagdoctor.stages.notify import incident_scope
from lagdoctor.stages.params import FormError, check_cluster, check_thresholds, validate_params
from lagdoctor.stages.plan import choose_branches


def _age(path, days: float) -> None:
    t = time.time() - days * 86400
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t))


def test_retention_prunes_old_findings_and_reports_but_keeps_recent_ones(tmp_path):
    settings = Settings(data_root=str(tmp_path))
    old_run = tmp_path / "findings" / "scheduled__old"
    new_run = tmp_path / "findings" / "scheduled__new"
    old_report = tmp_path / "reports" / "scheduled__old"
    for d in (old_run, new_run, old_report):
        d.mkdir(parents=True)
        (d / "findings.jsonl").write_text("{}\n")
        (d / "partition_status.jsonl").write_text("{}\n")
    _age(old_run, 10)
    _age(old_report, 10)
    removed = prune_history(keep_days=7, settings=settings)
    assert removed == 2
    assert not old_run.exists() and not old_report.exists() and new_run.exists()


def test_retention_keeps_a_week_of_history_for_the_longest_window_plus_a_grace_day(tmp_path):
    """The incident form reads up to 7 days back: keep_days below that would delete under a running job."""
    settings = Settings(data_root=str(tmp_path))
    now = datetime(2026, 11, 21, 0, 10, tzinfo=timezone.utc)
    days = {d: tmp_path / "snapshots" / "cluster=prod" / f"date={(now - timedelta(days=d)):%Y-%m-%d}" for d in (7, 8, 9)}
    for folder in days.values():
        folder.mkdir(parents=True)
        (folder / "a.parquet").write_bytes(b"x")
    prune_history(keep_days=1, settings=settings, now=now)
    assert days[7].exists() and days[8].exists() and not days[9].exists()


def test_retention_keeps_a_run_still_writing_and_removes_an_abandoned_one(tmp_path):
    """A job writing its outputs now has fresh files, however unfinished; a folder a failed
    job left a month ago (no findings.jsonl ever) must not be kept forever."""
    settings = Settings(data_root=str(tmp_path))
    running = tmp_path / "findings" / "kafka_lag_incident__manual-1"
    running.mkdir(parents=True)
    (running / "quarantined.jsonl").write_text("")
    abandoned = tmp_path / "findings" / "kafka_lag_incident__manual-0"
    abandoned.mkdir(parents=True)
    (abandoned / "quarantined.jsonl").write_text("")
    report = tmp_path / "reports" / "kafka_lag_incident__manual-0"
    report.mkdir(parents=True)
    (report / "a.html").write_text("x")
    for d in (abandoned, report):
        _age(d, 30)
    assert prune_history(settings=settings) == 2
    assert running.exists() and not abandoned.exists() and not report.exists()


def _run_folder(root, run_id: str, age_days: float):
    folder = root / "findings" / run_key(run_id, "kafka_lag_health_sweep")
    folder.mkdir(parents=True)
    (folder / "findings.jsonl").write_text("{}\n")
    (folder / "partition_status.jsonl").write_text("{}\n")
    _age(folder, age_days)
    return folder


def test_retention_prunes_at_most_once_an_hour_and_keeps_an_old_run_written_again(tmp_path):
    """Issue 31: a sweep every minute looked at every run folder every minute. Retention now runs once
    an hour (the marker in the data root), still removes what expired, and an old run by its id that
    is being written now (a cleared task of last month's run) keeps its folder."""
    settings = Settings(data_root=str(tmp_path))
    now = datetime.now(timezone.utc)  # the files' own times are real
    month_ago = f"scheduled__{now - timedelta(days=30):%Y-%m-%dT%H:%M:%S}+00:00"
    expired = _run_folder(tmp_path, month_ago, 30)
    rewritten = _run_folder(tmp_path, f"scheduled__{now - timedelta(days=29):%Y-%m-%dT%H:%M:%S}+00:00", 0)
    recent = _run_folder(tmp_path, f"scheduled__{now:%Y-%m-%dT%H:%M:%S}+00:00", 0)
    assert prune_history(settings=settings, now=now) == 1
    assert not expired.exists() and rewritten.exists() and recent.exists()

    expired_later = _run_folder(tmp_path, month_ago.replace("scheduled__", "manual__"), 30)
    assert prune_history(settings=settings, now=now + timedelta(minutes=59)) == 0  # within the hour: nothing
    assert expired_later.exists()
    assert prune_history(settings=settings, now=now + timedelta(minutes=61)) == 1
    assert not expired_later.exists() and rewritten.exists() and recent.exists()


@pytest.mark.parametrize("run_id", ["..", ".", "a/../../b", "/etc/passwd", "", "a" * 500,
                                    "scheduled__2026-11-21T03:15:00+00:00"])
def test_run_key_is_one_safe_folder_name(run_id, tmp_path):
    key = run_key(run_id, "kafka_lag_incident")
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}", key)  # what the reports route accepts
    assert key not in (".", "..") and len(key) <= 100
    assert (tmp_path / key).resolve().parent == tmp_path.resolve()
    assert key == run_key(run_id, "kafka_lag_incident")  # stable across retries


def test_run_keys_differ_where_run_ids_or_dags_differ():
    ids = ["a/b", "a_b", "a:b", "a b", "..", "...", "a/../b", "a_.._b"]
    keys = {run_key(r, "kafka_lag_incident") for r in ids}
    assert len(keys) == len(ids)
    assert run_key("manual__1", "kafka_lag_incident") != run_key(
        "manual__1", "kafka_lag_health_sweep")
    assert run_key("scheduled__2026-11-21T03:15:00+00:00", "kafka_lag_health_sweep").startswith(
        "kafka_lag_health_sweep__scheduled__2026-11-21T03_15_00_00_00-")


def test_branches_are_one_group_per_wanted_action():
    summary = {"plans": "/x/plans.json",
               "actions": {"restart_consumers": 2, "recommend_consumer_config": 1, "not_an_action": 1}}
    assert choose_branches(summary) == [
        "remediate_recommend_consumer_config.run", "remediate_restart_consumers.gate",
    ]
    # The sweep has no approval gate: it proposes, never waits.
    assert choose_branches(summary, approvals=False) == [
        "remediate_recommend_consumer_config.run", "remediate_restart_consumers.run",
    ]
    assert choose_branches({"plans": "/x/plans.json", "actions": {}}) == []
    assert choose_branches(None) == []  # the plan task failed: no branch at all


def test_incident_scope_names_what_was_looked_at():
    assert incident_scope({"cluster": "prod", "group_pattern": "orders-.*", "topic": ""}) == \
        "prod / orders-.*"
    assert incident_scope({"cluster": "prod", "group_pattern": "", "topic": "clicks"}) == \
        "prod / .* / clicks"
    # The validated form lists its clusters: the scope names them all.
    assert incident_scope({"cluster": "eu", "clusters": ["eu", "us"], "group_pattern": "g"}) == \
        "eu, us / g"


@pytest.mark.parametrize("overrides, expected", [
    ({"warning_lag": "5000"}, {"warning_lag": 5000}),
    ('{"warning_lag": 5000, "surge_ratio": 1.5}', {"warning_lag": 5000, "surge_ratio": 1.5}),  # the form's text
    ("", {}),
    (None, {}),
    ({"warning_lag": 5000.0}, {"warning_lag": 5000}),
])
def test_threshold_overrides_accept_an_object_or_its_text(overrides, expected):
    assert check_thresholds(overrides) == expected


@pytest.mark.parametrize("overrides, message", [
    ({"warning_lag": "abc"}, "thresholds.warning_lag: expected a number, got 'abc'"),
    ({"warning_lag": 1.5}, "thresholds.warning_lag: expected a whole number, got 1.5"),
    ({"warning_lag": True}, "thresholds.warning_lag: expected a number, got True"),
    ({"surge_ratio": -1}, "thresholds.surge_ratio: must be at least 0, got -1"),
    ({"warn_lag": 5000}, "thresholds.warn_lag: unknown threshold; known: warning_lag, critical_lag"),
    ('{"warning_lag": ', "thresholds: not valid JSON"),
    ("[1, 2]", "thresholds: expected a JSON object"),
])
def test_bad_threshold_names_the_field(overrides, message):
    with pytest.raises(FormError) as err:
        check_thresholds(overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.fixture
def kafka_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:9"}}))
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)


def _form(**kw):
    return {"cluster": "kafka_default", "group_pattern": "orders-.*", "topic": "", "window_minutes": 120,
            "samples": 3, "interval_seconds": 5, "thresholds": {}, **kw}


def test_a_good_form_comes_back_normalised(kafka_conn):
    form = validate_params(_form(thresholds='{"warning_lag": "10"}', window_minutes="30"))
    assert form == {"cluster": "kafka_default", "clusters": ["kafka_default"], "group_pattern": "orders-.*",
                    "topic": None, "window_minutes": 30.0, "samples": 3, "interval_seconds": 5.0,
                    "thresholds": {"warning_lag": 10}}


@pytest.mark.parametrize("change, message", [
    ({"cluster": "prod_eu"}, "cluster: no Airflow connection 'prod_eu' of type kafka"),
    ({"cluster": ""}, "cluster: required"),
    ({"group_pattern": "("}, "invalid group_pattern regex '(': "),
    ({"group_pattern": "(a+)+$" * 200}, "invalid group_pattern regex '(a+)+$"),
    ({"topic": "a topic"}, "topic: 'a topic' is not a Kafka topic name"),
    ({"window_minutes": 0}, "window_minutes: must be at least 1"),
    ({"window_minutes": 10081}, "window_minutes: must be at most 10080"),
    ({"samples": 60, "interval_seconds": 300}, "samples x interval_seconds: 60 x 300 s is more than"),
    ({"thresholds": {"warning_lag": "abc"}}, "thresholds.warning_lag: expected a number, got 'abc'"),
])
def test_a_bad_form_fails_with_one_line_naming_the_field(kafka_conn, change, message):
    with pytest.raises(FormError) as err:
        validate_params(_form(**change))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_the_default_cluster_falls_back_to_the_environment_but_no_other_does(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
    assert check_cluster("kafka_default", env) == "kafka_default"
    with pytest.raises(FormError, match="KAFKA_BOOTSTRAP_SERVERS is not set"):
        check_cluster("kafka_default", {})
    with pytest.raises(FormError, match="^cluster: no Airflow connection 'other' of type kafka$"):
        check_cluster("other", env)


def test_a_connection_of_another_type_is_named(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PROD", json.dumps({"conn_type": "postgres", "host": "db", "password": "s3cret!"}))
    with pytest.raises(FormError) as err:
        check_cluster("prod")
    assert str(err.value) == "cluster: connection 'prod' is of type 'postgres', expected kafka"


@pytest.mark.parametrize("message, code, line", [
    ("Cannot execute: spark-submit ... Error code is: 3.\n... diagnose_lag: error: cannot diagnose /s: "
     "CANNOT_MERGE_SCHEMAS in /s/x.parquet column partition\nmore", 3,
     "diagnosis: cannot diagnose /s: CANNOT_MERGE_SCHEMAS in /s/x.parquet column partition"),
    ("Cannot execute: spark-submit ... Error code is: 1.", 1, "diagnosis: spark-submit failed (exit code 1)"),
])
def test_the_jobs_own_failure_line_is_what_the_task_says(message, code, line):
    assert diagnosis_failure_line(message) == (code, line)


def test_the_sweep_compacts_closed_hours_and_reads_the_same_rows(tmp_path):
    """The sweep's compact_history task: a closed hour's 12 sample files become one, the
    rows read back are the same, the current hour is left as it is."""
    import pyarrow as pa

    from lagdoctor import store
    from lagdoctor.contracts import snapshot_arrow_schema

    settings = Settings(data_root=str(tmp_path))
    now = datetime(2026, 11, 21, 9, 2, tzinfo=timezone.utc)

    def sample(ts):
        rows = [dict(snapshot_ts=ts, cluster="prod", group_id="g", group_state="STABLE", topic="t", partition=p,
                     log_start_offset=0, log_end_offset=100, committed_offset=90, lag=10, member_id="m",
                     client_id="c", host="h", group_members=1) for p in range(2)]
        store.write_snapshot(pa.Table.from_pylist(rows, schema=snapshot_arrow_schema()), settings.snapshots_root,
                             "prod", ts)

    for k in range(12):
        sample(datetime(2026, 11, 21, 5, 5 * k, tzinfo=timezone.utc))
    sample(now)
    before = store.read_snapshots(settings.snapshots_root).sort_by("snapshot_ts").to_pylist()

    done = compact_history(settings=settings, now=now)

    assert done["hours"] == 1 and done["files_folded"] == 12
    hour5 = [p.name for p in (tmp_path / "snapshots/cluster=prod/date=2026-11-21/hour=05").glob("*.parquet")]
    assert sum(n.startswith("compacted-") for n in hour5) == 1
    assert store.read_snapshots(settings.snapshots_root).sort_by("snapshot_ts").to_pylist() == before
    compact_history(settings=settings, now=now + timedelta(hours=2))  # past the grace: originals go
    assert [p.name.startswith("compacted-") for p in
            (tmp_path / "snapshots/cluster=prod/date=2026-11-21/hour=05").glob("*.parquet")] == [True]
    assert store.read_snapshots(settings.snapshots_root).sort_by("snapshot_ts").to_pylist() == before


def test_retention_also_prunes_the_state_database(tmp_path):
    """Old closed leases go with the week's files; a live one stays."""
    from lagdoctor.state import StateDB

    settings = Settings(data_root=str(tmp_path))
    now = datetime(2026, 11, 21, 0, 10, tzinfo=timezone.utc)
    db = StateDB.from_settings(settings)
    db.acquire_lease("deployment orders", "a-run-that-died", timedelta(minutes=15), now=now - timedelta(days=20))
    db.acquire_lease("deployment search", "a-live-run", timedelta(minutes=15), now=now)
    prune_history(settings=settings, now=now)
    assert db.lease_holder("deployment search", now=now) == "a-live-run"
    from sqlalchemy import func, select

    from lagdoctor.state import leases

    with db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(leases)).scalar() == 1
