"""Fault tests: remediation never acts twice.

Runs race the real ``run_action`` in threads and in processes (multiprocessing
spawn, as two Airflow workers would), against the loopback Kubernetes API of
tests/fixtures/k8s.py and, for the Kafka action, the embedded broker. Every
test runs with the state database on SQLite and on PostgreSQL.

To make a race deterministic the Kubernetes double holds its answers: the
winner's patch is applied and stays in flight while the others try, which is
the window a real double action needs.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from lagdoctor.remediation import RemediationConfig, RemediationFailed, run_action
from lagdoctor.remediation.audit import ActionLog
from lagdoctor.state import leases

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
TARGET = "Deployment shop/orders-consumer"


def crashed(group: str = "orders") -> dict[str, Any]:
    return {"cluster": "prod", "group_id": group, "topic": "orders.v1", "partitions": [],
            "diagnosis": "crashed_consumer", "pattern": "steady_climb", "severity": "critical",
            "summary": "group is EMPTY", "evidence": {"partition_count": 6, "group_members": 0}}


def config_for(k8s, **kw: Any) -> dict[str, Any]:
    """A remediation config as the user writes it (a mapping: it crosses into spawned processes)."""
    return {"deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"}},
            "require_approval": ["restart_consumers"], "kubernetes": {"host": k8s.url}, **kw}


@pytest.fixture
def log(state_url, tmp_path, monkeypatch) -> ActionLog:
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("LAGDOCTOR_REMEDIATION_CONFIG", raising=False)
    return ActionLog.from_settings()  # creates the tables before any race


@pytest.fixture
def k8s(k8s_server):
    k8s_server.add_deployment("shop", "orders-consumer", replicas=2)
    return k8s_server


def act(start, results, name: str, finding: dict[str, Any], run_id: str, config: dict[str, Any],
        dry_run: bool = False, now: datetime = T0) -> None:
    """One run's remediation task (a thread or a spawned process): an approved real action by default."""
    start.wait(120)
    try:
        record = run_action(name, finding, run_id=run_id, dry_run=dry_run, approved=True, now=now,
                            config=RemediationConfig.from_mapping(config))
    except RemediationFailed as exc:
        record = {"status": "raised", "message": str(exc)}
    except Exception as exc:  # surfaced by the test, not lost in a worker
        record = {"status": "crashed", "message": f"{type(exc).__name__}: {exc}"}
    results.put((run_id, record))


def race(how: str, calls: list[tuple], *, k8s=None, in_flight: int = 0, timeout_s: float = 180) -> dict[str, dict]:
    """Start every call at once; when ``in_flight`` patches are held on the double and
    every other run has answered, let the held patches answer. {run_id: record}."""
    if how == "threads":
        start, results = threading.Barrier(len(calls)), queue.Queue()
        workers = [threading.Thread(target=act, args=(start, results, *call), daemon=True) for call in calls]
    else:
        ctx = multiprocessing.get_context("spawn")
        start, results = ctx.Barrier(len(calls)), ctx.Queue()
        workers = [ctx.Process(target=act, args=(start, results, *call)) for call in calls]
    for w in workers:
        w.start()
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < len(calls):
            if k8s is not None and len(out) == len(calls) - in_flight and len(k8s.writes()) >= in_flight:
                k8s.release_answers()
            try:
                run_id, record = results.get(timeout=0.1)
                out[run_id] = record
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise AssertionError(f"only {sorted(out)} answered within {timeout_s:g} s")
    finally:
        if k8s is not None:
            k8s.release_answers()
        for w in workers:
            w.join(30)
    return out


def lease_rows(log: ActionLog) -> list[dict]:
    with log.db.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(leases)).mappings()]


def statuses(log: ActionLog) -> list[tuple[str, str]]:
    return [(r["run_id"], r["status"]) for r in log.records()]


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_two_runs_racing_one_restart_patch_the_deployment_once(log, k8s, how):
    k8s.hold_answers()
    cfg = config_for(k8s)
    calls = [("restart_consumers", crashed(), run, cfg) for run in ("run-a", "run-b")]
    results = race(how, calls, k8s=k8s, in_flight=1)

    assert len(k8s.writes()) == 1, "the Deployment was restarted twice"
    (winner,) = [run for run, rec in results.items() if rec["status"] == "executed"]
    (loser,) = [run for run, rec in results.items() if run != winner]
    assert results[loser]["status"] == "blocked" and results[loser]["rule"] == "lease"
    assert results[loser]["message"] == f"lease: another run ({winner}) is acting on {TARGET}"
    # Nothing lost: each run's decision is in the log, the winner's written ahead of its patch.
    assert sorted(statuses(log)) == sorted([(winner, "started"), (winner, "executed"), (loser, "blocked")])
    assert lease_rows(log) == []  # given back with the outcome
    # The loser's retry (Airflow retries the task) returns its decision and acts no more.
    retry = run_action("restart_consumers", crashed(), run_id=loser, dry_run=False, approved=True, now=T0,
                       config=RemediationConfig.from_mapping(cfg))
    assert retry == results[loser] and len(k8s.writes()) == 1


@pytest.mark.parametrize("how", ["processes", "threads, slow database"])
def test_racing_runs_never_pass_the_hourly_cap(log, k8s, how, monkeypatch):
    if how != "processes":
        # A slow database between reading the history and writing `started`: every run
        # reads the history while the others are still deciding, unless claims take turns.
        read = ActionLog.attempts_since

        def slow_read(self, *args, **kwargs):
            rows = read(self, *args, **kwargs)
            time.sleep(0.5)
            return rows

        monkeypatch.setattr(ActionLog, "attempts_since", slow_read)
    groups = [f"g{i}" for i in range(4)]
    for g in groups:
        k8s.add_deployment("shop", g, replicas=1)
    cfg = config_for(k8s, max_actions_per_hour=2, cooldown_minutes=0,
                     deployments={g: {"namespace": "shop", "name": g} for g in groups})
    calls = [("restart_consumers", crashed(g), f"run-{g}", cfg) for g in groups]
    k8s.hold_answers()  # two patches in flight: both count while the other two runs decide
    results = race(how.split(",")[0], calls, k8s=k8s, in_flight=2)

    assert len(k8s.writes()) == 2
    assert sorted(r["status"] for r in results.values()) == ["blocked", "blocked", "executed", "executed"]
    for rec in results.values():
        if rec["status"] == "blocked":
            assert rec["rule"] == "hourly_cap" and rec["message"] == "hourly_cap: 2 actions in the last hour (cap 2)"
    restarted = [g for g in groups if k8s.deployments[("shop", g)]["annotations"]]
    assert sorted(restarted) == sorted(r["group_id"] for r in results.values() if r["status"] == "executed")


def test_a_patch_whose_answer_times_out_fails_in_one_line_and_counts(log, k8s):
    cfg = config_for(k8s, cooldown_minutes=30, kubernetes={"host": k8s.url, "request_timeout_seconds": 0.5})
    k8s.hold_answers()  # the API server applies the patch, then answers too late
    with pytest.raises(RemediationFailed) as err:
        run_action("restart_consumers", crashed(), run_id="run-a", dry_run=False, approved=True, now=T0,
                   config=RemediationConfig.from_mapping(cfg))
    message = str(err.value)
    assert message == ("restart_consumers failed for group orders: no answer from the Kubernetes API within 0.5 s; "
                       "the rollout restart of shop/orders-consumer may have been applied")
    assert k8s.deployments[("shop", "orders-consumer")]["annotations"] == {RESTARTED_AT: "2026-11-21T10:00:00Z"}
    failed = list(log.records())[-1]
    assert failed["status"] == "failed" and failed["may_have_changed"] is True and failed["message"] in message

    # Another run within the cooldown: the patch that may have landed counts.
    k8s.release_answers()
    other = run_action("restart_consumers", crashed(), run_id="run-b", dry_run=False, approved=True,
                       now=T0 + timedelta(minutes=5), config=RemediationConfig.from_mapping(cfg))
    assert other["status"] == "blocked" and other["rule"] == "cooldown"
    assert other["message"] == (f"cooldown: restart_consumers on {TARGET} started at 2026-11-21T10:00:00+00:00 by "
                                "run run-a and may have taken effect before it failed; cooldown ends in 26 min")
    assert len(k8s.writes()) == 1

    # Airflow's retry of run-a resumes its own plan: the same restartedAt, so no second rollout.
    retry = run_action("restart_consumers", crashed(), run_id="run-a", dry_run=False, approved=True,
                       now=T0 + timedelta(minutes=3), config=RemediationConfig.from_mapping(cfg))
    assert retry["status"] == "executed"
    assert [w.body for w in k8s.writes()] == [k8s.writes()[0].body] * 2
    assert k8s.deployments[("shop", "orders-consumer")]["annotations"] == {RESTARTED_AT: "2026-11-21T10:00:00Z"}
    assert statuses(log) == [("run-a", "started"), ("run-a", "failed"), ("run-b", "blocked"), ("run-a", "executed")]


def test_a_worker_killed_mid_patch_keeps_others_off_until_its_lease_expires(log, k8s):
    cfg = config_for(k8s, cooldown_minutes=30, lease_minutes=15)
    k8s.hold_answers()
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(1), ctx.Queue()
    worker = ctx.Process(target=act, args=(start, results, "restart_consumers", crashed(), "run-a", cfg))
    worker.start()
    try:
        k8s.wait_for_writes(1)
    finally:
        worker.kill()  # the worker dies with its patch applied and unanswered
        worker.join(30)
        k8s.release_answers()
    assert statuses(log) == [("run-a", "started")]
    config = RemediationConfig.from_mapping(cfg)

    def attempt(run_id: str, minutes: int) -> dict:
        return run_action("restart_consumers", crashed(), run_id=run_id, dry_run=False, approved=True,
                          now=T0 + timedelta(minutes=minutes), config=config)

    assert attempt("run-b", 10)["message"] == f"lease: another run (run-a) is acting on {TARGET}"
    # Lease expired, but the restart may have happened: it still counts for the cooldown.
    assert attempt("run-c", 16)["message"] == (
        f"cooldown: restart_consumers on {TARGET} started at 2026-11-21T10:00:00+00:00 by run run-a and has no "
        "outcome yet; cooldown ends in 15 min")
    assert attempt("run-d", 31)["status"] == "executed"
    assert len(k8s.writes()) == 2


def test_a_rerun_of_the_same_run_id_patches_nothing_more(log, k8s):
    cfg = RemediationConfig.from_mapping(config_for(k8s))
    first = run_action("restart_consumers", crashed(), run_id="run-a", dry_run=False, approved=True, now=T0, config=cfg)
    rerun = run_action("restart_consumers", crashed(), run_id="run-a", dry_run=False, approved=True,
                       now=T0 + timedelta(hours=2), config=cfg)  # a cleared task, well past the cooldown
    assert first["status"] == "executed" and rerun == first
    assert len(k8s.writes()) == 1
    assert statuses(log) == [("run-a", "started"), ("run-a", "executed")]


def test_dry_runs_in_the_race_take_no_lease_and_change_nothing(log, k8s):
    cfg = config_for(k8s)
    k8s.hold_answers()
    calls = [("restart_consumers", crashed(), "run-real", cfg),
             *[("restart_consumers", crashed(), f"run-dry-{i}", cfg, True) for i in range(3)]]
    # The dry runs answer while the real run's patch is in flight.
    results = race("threads", calls, k8s=k8s, in_flight=1)

    assert results["run-real"]["status"] == "executed" and len(k8s.writes()) == 1
    for i in range(3):
        rec = results[f"run-dry-{i}"]
        assert rec["dry_run"] is True and rec["status"] in ("dry_run", "blocked")
        if rec["status"] == "blocked":  # it met the real run's restart, as a real run would
            assert rec["rule"] == "cooldown" and "by run run-real" in rec["message"]
    assert len(k8s.requests) == 1
    assert lease_rows(log) == []
    # And they count against nothing: only the real restart is in the cooldown's history.
    counted = log.attempts_since(T0 - timedelta(hours=1))
    assert [(r["run_id"], r["outcome"]) for r in counted] == [("run-real", "executed")]


# ------------------------------------------------------------ the Kafka action, on the embedded broker

@pytest.mark.broker
def test_two_runs_racing_to_skip_one_poison_pill_skip_it_once(log, kafka_bootstrap, unique, monkeypatch):
    from tests.test_remediation_kafka import commit, committed, create_topics, produce, read_all, stalled

    topic, group = unique("payments"), unique("payments-ledger")
    create_topics(kafka_bootstrap, topic)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(6)])
    commit(kafka_bootstrap, group, topic, 0, 3)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_RACE", json.dumps({"conn_type": "kafka",
                                                              "extra": {"bootstrap.servers": kafka_bootstrap}}))
    finding = stalled("kafka_race", group, topic, 3)
    results = race("threads", [("skip_poison_pill", finding, run, {}) for run in ("run-a", "run-b")])

    (winner,) = [run for run, rec in results.items() if rec["status"] == "executed"]
    (loser,) = [run for run, rec in results.items() if run != winner]
    # Whether it met the winner mid-action or just after, the loser names it and skips nothing.
    assert results[loser]["status"] == "blocked" and results[loser]["rule"] in ("lease", "cooldown")
    assert f"({winner})" in results[loser]["message"] or f"by run {winner}" in results[loser]["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 4
    assert [m.value() for m in read_all(kafka_bootstrap, f"{topic}.dlq")] == [b"v3"]
