"""State database faults: stopped, paused (SIGSTOP) and back, mid-run.

A real PostgreSQL server of the test's own (tests/fixtures/postgres.py) is
stopped or paused between the calls one run makes; the loopback Slack server
(tests/fixtures/slack.py) shows what people get. Every message the outage
held back (a finding, an incident recovery, the failure notice and the DAG's
recovery) must reach Slack once the database is back, each exactly once.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from datetime import datetime, timedelta, timezone

import pytest

import airflow.sdk  # noqa: F401  (Airflow configures logging on first import)

from lagdoctor.notify.incidents import (
    delivery_batch,
    deliver_pending,
    notify_failure,
    notify_recovery,
    post_action_result,
    post_or_update_incident,
)
from lagdoctor.notify.spool import spooled
from lagdoctor.settings import Settings
from tests.fixtures.slack import SLACK_TEST_TOKEN

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
SWEEP = "kafka_lag_health_sweep"
# Connection refused at once: a state database that is down, without a server to stop.
DOWN_URL = "postgresql+psycopg://ld:s3cr3t-pw@127.0.0.1:9/lagdoctor"


def finding(group="orders", diagnosis="slow_consumer", severity="warning", lag=1000, **evidence):
    return {"cluster": "prod", "group_id": group, "topic": "orders.v1", "partitions": [0],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": severity, "summary": f"lag {lag}",
            "evidence": {"lag_total": lag, **evidence},
            "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}


class TI:
    def __init__(self, dag_id: str, task_id: str, run_id: str) -> None:
        self.dag_id, self.task_id, self.run_id = dag_id, task_id, run_id


class Dag:
    dag_id = SWEEP


def failure(run_id: str, reason: str = "lagdoctor's state database is down") -> dict:
    return {"ti": TI(SWEEP, "post_findings", run_id), "run_id": run_id, "exception": RuntimeError(reason)}


@pytest.fixture
def own_state(own_postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", own_postgres.url)
    return own_postgres


def bounded(call, *args, **kwargs):
    """Run `call` in a thread; a call that hangs (no connect timeout) fails the test
    instead of stalling it. The bound is a safety net, not what is asserted."""
    out: dict = {}

    def run():
        try:
            out["result"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), f"{call.__name__} hung on the unreachable state database"
    if "error" in out:
        raise out["error"]
    return out["result"]


def check_spooled(result: dict) -> None:
    assert result["decision"] == "spooled"
    assert result["undelivered"] >= 1
    line = result["delivery_error"]
    assert "\n" not in line and "spool" in line and SLACK_TEST_TOKEN not in line


def assert_everything_missed_arrived_once(server) -> None:
    """Slack got, in order and once each: the orders thread, the missed CRITICAL
    finding, the orders recovery in its thread, the failure notice and the DAG's
    recovery in the failure thread."""
    posts = server.posts
    texts = [p.body["text"] for p in posts]
    assert len(posts) == 5, texts
    orders, payments, recovered, failed, dag_ok = posts
    assert "slow_consumer for group orders" in orders.body["text"]
    assert "crashed_consumer for group payments" in payments.body["text"] and "thread_ts" not in payments.body
    assert recovered.body["thread_ts"] == orders.ts and "recovered" in recovered.body["text"].lower()
    assert SWEEP in failed.body["text"] and "thread_ts" not in failed.body
    assert "state database is down" in json.dumps(failed.body["blocks"])
    assert dag_ok.body["thread_ts"] == failed.ts and "recovered after 1 failed run(s)" in dag_ok.body["text"]


def test_state_database_stopped_mid_run_then_every_missed_message_goes_out_once(own_state, slack_connection):
    server, pg = slack_connection, own_state
    assert post_or_update_incident(finding("orders"), run_id="r1", now=T0)["decision"] == "posted"

    pg.stop()  # mid-run: r2's tasks and its failure callback meet a stopped database
    at = T0 + timedelta(minutes=5)
    with delivery_batch():
        results = [bounded(post_or_update_incident, finding("payments", "crashed_consumer", "critical"),
                           run_id="r2", now=at),
                   bounded(post_or_update_incident, finding("orders", "healthy", "ok", lag=0), run_id="r2", now=at)]
    for r in results:
        check_spooled(r)
    check_spooled(bounded(notify_failure, failure("r2"), now=at))
    assert len(server.posts) == 1  # nothing went out without the state, nothing was lost either
    assert len(spooled(Settings.from_env())) == 3

    pg.start()
    # r3 succeeds: the DAG's success callback is the first call to reach the database.
    done = notify_recovery({"dag": Dag(), "run_id": "r3"}, now=T0 + timedelta(minutes=10))
    assert done["decision"] == "recovered" and done["undelivered"] == 0
    assert_everything_missed_arrived_once(server)
    assert spooled(Settings.from_env()) == []
    # Later runs repeat none of it: r3's own findings are what r2's were.
    later = T0 + timedelta(minutes=10)
    assert post_or_update_incident(finding("payments", "crashed_consumer", "critical"), run_id="r3",
                                   now=later)["decision"] == "unchanged"
    assert deliver_pending() == {"undelivered": 0, "delivery_error": None}
    assert len(server.posts) == 5


def test_state_database_paused_fails_within_the_connect_timeout_then_everything_goes_out_once(
        own_state, slack_connection):
    server, pg = slack_connection, own_state
    assert post_or_update_incident(finding("orders"), run_id="r1", now=T0)["decision"] == "posted"

    pg.pause()  # SIGSTOP: connections are accepted by the kernel and never answered
    at = T0 + timedelta(minutes=5)
    first = bounded(post_or_update_incident, finding("payments", "crashed_consumer", "critical"), run_id="r2",
                    now=at)
    check_spooled(first)
    # The connect timeout fired (seconds), rather than TCP giving up after minutes.
    assert "timeout" in first["delivery_error"].lower()
    check_spooled(bounded(post_or_update_incident, finding("orders", "healthy", "ok", lag=0), run_id="r2", now=at))
    check_spooled(bounded(notify_failure, failure("r2"), now=at))
    assert len(server.posts) == 1

    pg.resume()
    done = notify_recovery({"dag": Dag(), "run_id": "r3"}, now=T0 + timedelta(minutes=10))
    assert done["decision"] == "recovered" and done["undelivered"] == 0
    assert_everything_missed_arrived_once(server)
    assert spooled(Settings.from_env()) == []


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    return Settings.from_env()


def test_a_spool_file_replayed_twice_queues_its_message_once(settings, state_url, slack_connection,
                                                            monkeypatch, tmp_path):
    server = slack_connection
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    result = post_or_update_incident(finding("payments", "crashed_consumer", "critical"), run_id="r1", now=T0)
    check_spooled(result)
    assert "s3cr3t-pw" not in result["delivery_error"]
    (path,) = spooled(settings)
    kept = tmp_path / "kept.json"
    shutil.copy(path, kept)

    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    assert deliver_pending() == {"undelivered": 0, "delivery_error": None}
    # A crash between the replay's commit and removing its file, or a second
    # worker replaying the same file: it comes back and must act once only.
    shutil.copy(kept, path)
    assert deliver_pending() == {"undelivered": 0, "delivery_error": None}
    (post,) = server.posts
    assert "crashed_consumer for group payments" in post.body["text"]
    assert spooled(settings) == []


def test_replay_keeps_the_original_order_and_run(settings, state_url, slack_connection, monkeypatch):
    """A finding spooled during r1 and its action result: the result replies in
    the thread the replayed finding opened."""
    server = slack_connection
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    check_spooled(post_or_update_incident(finding("orders"), run_id="r1", now=T0))
    check_spooled(post_action_result({"cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                                      "diagnosis": "slow_consumer", "idempotency_key": "k1",
                                      "action": "scale_consumers", "status": "dry_run",
                                      "message": "would scale orders by +1 replicas"}, now=T0))
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    # r1 again (a retry) once the database is back: nothing twice.
    again = post_or_update_incident(finding("orders"), run_id="r1", now=T0)
    assert again["decision"] == "unchanged" and again["undelivered"] == 0
    root, reply = server.posts
    assert "slow_consumer for group orders" in root.body["text"]
    assert reply.body["thread_ts"] == root.ts and "dry run" in reply.body["text"]


def test_an_unreadable_spool_file_is_set_aside_and_blocks_nothing(settings, state_url, slack_connection,
                                                                 monkeypatch, caplog):
    server = slack_connection
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    check_spooled(post_or_update_incident(finding("orders"), run_id="r1", now=T0))
    (path,) = spooled(settings)
    broken = path.with_name("00000000000000000000-corrupt.json")
    broken.write_text("{ half a file")
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    assert deliver_pending() == {"undelivered": 0, "delivery_error": None}
    assert len(server.posts) == 1
    assert broken.with_suffix(".failed").exists() and spooled(settings) == []
    assert any("cannot be replayed" in r.getMessage() for r in caplog.records)


def test_a_failure_callback_with_the_state_database_down_keeps_the_notice(settings, state_url, slack_connection,
                                                                         monkeypatch):
    """The issue's first symptom: the callback only logged StateConfigError and Slack got nothing, ever."""
    server = slack_connection
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    check_spooled(notify_failure(failure("r1", "cannot reach Kafka at 127.0.0.1:9092"), now=T0))
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    assert notify_recovery({"dag": Dag(), "run_id": "r2"}, now=T0)["decision"] == "recovered"
    failed, recovered = server.posts
    assert "cannot reach Kafka at 127.0.0.1:9092" in json.dumps(failed.body["blocks"])
    assert recovered.body["thread_ts"] == failed.ts


def test_a_sweep_posting_with_the_state_database_paused_waits_once_spools_all_and_says_so(
        own_state, slack_connection, tmp_path, monkeypatch):
    """post_findings (the sweep's Slack task) with the database paused: one connect
    timeout for the whole task, not one per finding; every message spooled; the task
    fails in one line; once the database is back each message goes out once."""
    import lagdoctor.state as state
    from lagdoctor.stages.notify import post_findings, SlackUndelivered

    server, pg = slack_connection, own_state
    findings = [finding(f"orders-{i}", "crashed_consumer", "critical") for i in range(4)]
    run_dir = tmp_path / "data" / "findings" / "sweep-1"
    run_dir.mkdir(parents=True)
    plans = run_dir / "plans.json"
    plans.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}} for f in findings]))
    (run_dir / "quarantined.jsonl").write_text(json.dumps(
        {"path": "/data/snapshots/bad.parquet", "moved_to": "/data/_quarantine/bad.parquet",
         "reason": "not a Parquet file"}) + "\n")
    opened = []
    real_engine_for = state.engine_for
    monkeypatch.setattr(state, "engine_for", lambda url: opened.append(url) or real_engine_for(url))
    state.dispose_engines()  # nothing cached: every call has to open the database

    pg.pause()
    with pytest.raises(SlackUndelivered) as err:
        bounded(post_findings, str(plans), "scheduled__1", settings=Settings.from_env())
    message = str(err.value)
    assert re.fullmatch(r"Slack: 5 message\(s\) not delivered, kept in the outbox: .*timeout.*spool.*", message), message
    assert len(opened) == 1  # the batch's later messages went straight to the spool
    assert server.posts == [] and len(spooled(Settings.from_env())) == 5

    pg.resume()
    assert deliver_pending()["undelivered"] == 0
    texts = [json.dumps(m) for m in server.messages]
    assert len(texts) == 5 and sum("bad.parquet" in t for t in texts) == 1
    assert all(sum(f"orders-{i}" in t for t in texts) == 1 for i in range(4))
    # The task retried now posts nothing twice.
    post_findings(str(plans), "scheduled__1", settings=Settings.from_env())
    assert len(server.posts) == 5


def worker(tmp_path, name: str) -> Settings:
    """One Celery worker's settings: the shared data root, a spool on its own disk."""
    return Settings(data_root=str(tmp_path / "data"), spool_dir=str(tmp_path / name / "spool"))


@pytest.mark.parametrize("spooled_finding, newer_finding, newer_says", [
    # the group recovered for a sweep the database missed, then went critical: no "Recovered" after "critical"
    (finding("orders", "healthy", "ok", lag=0), finding("orders", severity="critical", lag=90_000),
     "severity warning → critical"),
    # the group got worse for a sweep the database missed, then recovered: the thread stays closed
    (finding("orders", severity="critical", lag=90_000), finding("orders", "healthy", "ok", lag=0), "recovered"),
], ids=["stale-recovery", "stale-problem"])
def test_a_spooled_call_older_than_its_thread_is_dropped_not_sent(
        tmp_path, state_url, slack_connection, monkeypatch, caplog, spooled_finding, newer_finding, newer_says):
    server = slack_connection
    a, b = worker(tmp_path, "worker-a"), worker(tmp_path, "worker-b")
    assert post_or_update_incident(finding("orders"), run_id="r1", settings=b, now=T0)["decision"] == "posted"
    # r2 on worker A meets the database down: its call waits in A's spool
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    check_spooled(post_or_update_incident(spooled_finding, run_id="r2", settings=a, now=T0 + timedelta(minutes=5)))
    # r3 on worker B, five minutes later, reaches it and says what r3 found
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    post_or_update_incident(newer_finding, run_id="r3", settings=b, now=T0 + timedelta(minutes=10))
    assert len(server.posts) == 2 and newer_says in server.posts[1].body["text"].lower()

    # worker A is back: r2's call is older than what the thread already said
    caplog.set_level("WARNING", logger="lagdoctor.notify.spool")
    assert deliver_pending(a) == {"undelivered": 0, "delivery_error": None}
    assert len(server.posts) == 2, [p.body["text"] for p in server.posts]
    assert spooled(a) == []
    (line,) = [r.getMessage() for r in caplog.records if "spool: dropped" in r.getMessage()]
    assert "not sent: run r2's" in line and "prod / orders / orders.v1" in line and "by run r3" in line
    # and the thread is as r3 left it: r4's same verdict says nothing more
    again = post_or_update_incident(newer_finding, run_id="r4", settings=b, now=T0 + timedelta(minutes=15))
    assert again["decision"] in ("unchanged", "healthy") and len(server.posts) == 2


def test_a_spooled_recovery_older_than_a_newer_failure_is_dropped_not_sent(
        tmp_path, state_url, slack_connection, monkeypatch, caplog):
    """The DAG's failure thread: r2 succeeded while the database was down (its recovery spooled on worker A),
    r3 failed again on worker B; A's late "recovered" must not close a thread that is failing."""
    server = slack_connection
    a, b = worker(tmp_path, "worker-a"), worker(tmp_path, "worker-b")
    assert notify_failure(failure("r1"), settings=b, now=T0)["decision"] == "posted"
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", DOWN_URL)
    check_spooled(notify_recovery({"dag": Dag(), "run_id": "r2"}, settings=a, now=T0 + timedelta(minutes=5)))
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    notify_failure(failure("r3"), settings=b, now=T0 + timedelta(minutes=10))  # the same failure: counted

    caplog.set_level("WARNING", logger="lagdoctor.notify.spool")
    assert deliver_pending(a) == {"undelivered": 0, "delivery_error": None}
    assert len(server.posts) == 1, [p.body["text"] for p in server.posts]
    (line,) = [r.getMessage() for r in caplog.records if "spool: dropped" in r.getMessage()]
    assert f"not sent: run r2's recovery of DAG {SWEEP}" in line and "open failure thread" in line
    # the thread is still open: r4's success closes it, once
    assert notify_recovery({"dag": Dag(), "run_id": "r4"}, settings=b,
                           now=T0 + timedelta(minutes=15))["decision"] == "recovered"
    assert "recovered after 2 failed run(s)" in server.posts[1].body["text"]
