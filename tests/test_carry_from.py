"""Rule case 27's input: the run a diagnosis carries surges from (`--carry-from`).

A surge older than the window keeps the baseline an earlier run measured. That
run must have looked at the same groups the same way: one failed snapshot, a
run with threshold overrides or a manual run scoped to another cluster must
never drop the carried baseline and flip the diagnosis. Run folders are left
here the way the DAG leaves them (the job's two outputs, then plan_findings'
run.json); what is asserted is the path the Spark job is given.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from lagdoctor import runindex
from lagdoctor.settings import Settings
from lagdoctor.stages.common import run_key
from lagdoctor.stages.diagnose import CARRIED_FILE, prepare_diagnosis
from lagdoctor.stages.plan import plan_findings

SWEEP, INCIDENT = "kafka_lag_health_sweep", "kafka_lag_incident"
EU, US = "kafka_eu", "kafka_us"
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(minutes=30)


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setattr(runindex, "_MEMORY", {})  # each test's root is new; forget other tests' indexes
    return Settings(data_root=str(tmp_path / "data"))


def surge(cluster: str, baseline: float, at: datetime) -> dict:
    return {"cluster": cluster, "group_id": "orders", "topic": "orders", "partitions": [],
            "diagnosis": "producer_surge", "pattern": "steady_climb", "severity": "warning",
            "summary": "producers surged", "provisional": False,
            "evidence": {"baseline_produce_rate": baseline, "baseline_consume_rate": baseline,
                         "data_end": at.isoformat()},
            "window_start": (at - timedelta(minutes=30)).isoformat(), "window_end": at.isoformat()}


def leave_run(settings: Settings, name: str, minute: int, *, dag_id: str = SWEEP, run_id: str | None = None,
              read: tuple[str, ...] = (EU,), unread: tuple[str, ...] = (), overrides: dict | None = None,
              group_pattern: str | None = None, topic: str | None = None) -> Path:
    """A finished run: a surge finding per cluster read (its baseline = `minute`, to tell runs
    apart), then run.json as the DAG's plan task writes it."""
    at = T0 + timedelta(minutes=minute)
    folder = Path(settings.findings_root) / name
    folder.mkdir(parents=True)
    (folder / "findings.jsonl").write_text("".join(json.dumps(surge(c, float(minute), at)) + "\n" for c in read))
    (folder / "partition_status.jsonl").write_text("")
    plan_findings(str(folder), dag_id=dag_id, run_id=run_id or f"scheduled__{at.isoformat()}",
                  kind="incident" if dag_id == INCIDENT else "sweep", threshold_overrides=overrides,
                  now=at, clusters=list(read), clusters_unread=list(unread), group_pattern=group_pattern,
                  topic=topic)
    return folder


def carry_from(settings: Settings, clusters, *, dag_id: str = SWEEP, run_id: str = "scheduled__now",
               group_pattern: str | None = None, topic: str | None = None) -> str | None:
    args = prepare_diagnosis(clusters, run_id, window_minutes=30, dag_id=dag_id, as_of=NOW, settings=settings,
                             group_pattern=group_pattern, topic=topic)["args"]
    return args[args.index("--carry-from") + 1] if "--carry-from" in args else None


def findings_of(settings: Settings, name: str) -> str:
    return str(Path(settings.findings_root) / name / "findings.jsonl")


@pytest.mark.parametrize("newer, chosen", [
    # The finding of issue 30: each of these is newer than the comparable run, and each is skipped.
    (dict(run_id="manual__x", read=(US,)), "comparable"),  # a manual run scoped to another cluster
    (dict(run_id="manual__x", read=(EU,)), "comparable"),  # a manual click: the schedule's chain stays its own
    (dict(overrides={"warning_lag": 1}), "comparable"),  # an experiment's verdicts are no baseline
    (dict(read=(US,), unread=(EU,)), "comparable"),  # its snapshot of this cluster failed
    (dict(read=(), unread=(EU,)), "comparable"),  # ... and it read nothing at all
    (dict(dag_id=INCIDENT, run_id="manual__x"), "comparable"),  # another DAG
    # Still carried: a newer scheduled run that read this cluster (among others) is the one.
    (dict(read=(EU, US)), "newer"),
    (dict(read=(EU,), unread=(US,)), "newer"),  # another cluster's failure does not matter here
])
def test_a_scheduled_sweep_carries_from_the_newest_comparable_run(settings, newer, chosen):
    leave_run(settings, "comparable", 5)
    leave_run(settings, "newer", 10, **newer)
    assert carry_from(settings, [EU]) == findings_of(settings, chosen)


def test_never_its_own_folder_nor_a_later_run_and_nothing_before_the_first(settings):
    leave_run(settings, "before", 5)
    # A retry finds its own first try's folder, planned before the retry's `as_of`.
    own = leave_run(settings, run_key("scheduled__now", SWEEP), 10, run_id="scheduled__now")
    leave_run(settings, "later", 40)
    args = prepare_diagnosis([EU], "scheduled__now", window_minutes=30, dag_id=SWEEP, as_of=NOW,
                             settings=settings)
    assert args["output"].rstrip("/").endswith("/" + own.name)
    assert args["args"][args["args"].index("--carry-from") + 1] == findings_of(settings, "before")
    first = prepare_diagnosis([EU], "scheduled__first", window_minutes=30, dag_id=SWEEP, settings=settings,
                              as_of=T0)["args"]
    assert "--carry-from" not in first


def test_a_manual_run_carries_from_the_schedule_or_from_a_run_asked_about_the_same_groups(settings):
    leave_run(settings, "incident-orders", 5, dag_id=INCIDENT, run_id="manual__1", group_pattern="orders")
    leave_run(settings, "incident-other", 10, dag_id=INCIDENT, run_id="manual__2", group_pattern="billing")
    assert carry_from(settings, [EU], dag_id=INCIDENT, run_id="manual__3", group_pattern="orders") == \
        findings_of(settings, "incident-orders")
    # A manual sweep run (the sweep's scope) carries from the newest scheduled sweep, as the next scheduled run will.
    leave_run(settings, "sweep", 8)
    leave_run(settings, "manual-sweep-us", 12, run_id="manual__4", read=(US,))
    assert carry_from(settings, [EU], run_id="manual__5") == findings_of(settings, "sweep")


def test_each_cluster_of_a_sweep_carries_from_the_newest_run_that_read_it(settings):
    leave_run(settings, "both", 5, read=(EU, US))
    leave_run(settings, "eu-only", 10, read=(EU,), unread=(US,))
    path = carry_from(settings, [EU, US])
    assert path.endswith("/" + CARRIED_FILE)
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    # kafka_us keeps the baseline measured before its failed snapshot; kafka_eu takes the newer run's.
    assert sorted((r["cluster"], r["evidence"]["baseline_produce_rate"]) for r in rows) == [(EU, 10.0), (US, 5.0)]
    # When one run read every cluster, the job reads that run's findings directly.
    leave_run(settings, "both-again", 15, read=(EU, US))
    assert carry_from(settings, [EU, US]) == findings_of(settings, "both-again")
