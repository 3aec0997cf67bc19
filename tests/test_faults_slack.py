"""Slack faults: rate limits, an outage, re-runs, racing runs and a failing DAG.

Through the loopback Slack double and the real ProviderSlackSender (slack-sdk's
retry handlers), against SQLite and PostgreSQL (``state_url``). Each test
asserts what people see in Slack, that nothing is lost and nothing is sent twice.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import re
from datetime import datetime, timedelta, timezone

import pytest

import airflow.sdk  # noqa: F401  (Airflow configures logging on first import)

from lagdoctor.notify.incidents import (
    deliver_pending,
    notify_failure,
    notify_recovery,
    post_action_result,
    post_incident_run,
    post_notice,
    post_or_update_incident,
)
from lagdoctor.notify.outbox import pending_messages
from lagdoctor.notify.threads import ThreadStore
from lagdoctor.settings import Settings
from tests.fixtures.slack import SLACK_TEST_TOKEN

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def finding(group="orders", diagnosis="slow_consumer", severity="warning", lag=1000, **evidence):
    return {"cluster": "prod", "group_id": group, "topic": "orders.v1", "partitions": [0],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": severity, "summary": f"lag {lag}",
            "evidence": {"lag_total": lag, **evidence},
            "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}


def action(group="orders", diagnosis="slow_consumer", key="k1", status="dry_run"):
    return {"cluster": "prod", "group_id": group, "topic": "orders.v1", "diagnosis": diagnosis,
            "idempotency_key": key, "action": "scale_consumers", "status": status,
            "message": f"would scale {group} by +1 replicas"}


class TI:
    def __init__(self, dag_id: str, task_id: str, run_id: str) -> None:
        self.dag_id, self.task_id, self.run_id = dag_id, task_id, run_id


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    return Settings.from_env()


def texts(server) -> list[str]:
    return [m["text"] for m in server.messages]


def test_rate_limited_then_ok_every_message_once_in_order(settings, slack_connection):
    server = slack_connection
    server.fail_next(429, retry_after=1)
    first = post_or_update_incident(finding("orders"), run_id="r1", now=T0)
    server.fail_next(429, retry_after=0)
    server.fail_next(429, retry_after=0)
    reply = post_action_result(action("orders"))
    second = post_or_update_incident(finding("payments", "crashed_consumer", "critical"), run_id="r1", now=T0)
    assert [r["undelivered"] for r in (first, reply, second)] == [0, 0, 0]
    assert all(r["delivery_error"] is None for r in (first, reply, second))
    assert [r.status for r in server.requests] == [429, 200, 429, 429, 200, 200]
    assert server.requests[1].at - server.requests[0].at >= 1.0, "Retry-After was not honoured"
    root, action_reply, other = server.posts
    assert "slow_consumer for group orders" in root.body["text"] and "thread_ts" not in root.body
    assert action_reply.body["thread_ts"] == root.ts and "dry run" in action_reply.body["text"]
    assert "crashed_consumer for group payments" in other.body["text"] and "thread_ts" not in other.body
    assert first["threads"][0]["thread_ts"] == root.ts


def test_slack_down_nothing_lost_then_delivered_in_order_once(settings, slack_connection, capfd):
    server = slack_connection
    server.fail_all(500)
    results = [
        post_or_update_incident(finding("orders"), run_id="r1", now=T0),
        post_action_result(action("orders")),
        post_or_update_incident(finding("payments", "crashed_consumer", "critical"), run_id="r1", now=T0),
        post_or_update_incident(finding("orders", severity="critical", lag=5000), run_id="r2",
                                now=T0 + timedelta(minutes=5)),
        post_notice("file cluster=prod/x.parquet quarantined: <!channel> not a Parquet file",
                    dedupe_key="quarantine:x"),
    ]
    # What the task sees: decisions taken, a count of waiting messages and one line, no token.
    assert [r["decision"] for r in results] == ["posted", "replied", "posted", "replied", "queued"]
    assert [r["undelivered"] for r in results] == [1, 2, 3, 4, 5]
    for r in results:
        assert r["delivery_error"].count("\n") == 0 and SLACK_TEST_TOKEN not in r["delivery_error"]
        assert "service_unavailable" in r["delivery_error"]
    assert server.posts == []
    waiting = pending_messages(ThreadStore().db)
    assert len(waiting) == 5
    # Delivery stops at the first failure, so only the oldest message was tried (once per call).
    assert [m["attempts"] for m in waiting] == [5, 0, 0, 0, 0]
    assert SLACK_TEST_TOKEN not in json.dumps([m["last_error"] for m in waiting])
    # The thread has no Slack ts yet: nobody may pretend it does.
    assert results[0]["threads"][0]["thread_ts"] == ""

    server.heal()
    done = deliver_pending()
    assert done == {"undelivered": 0, "delivery_error": None}
    root, action_reply, other, update, notice = server.posts
    assert "slow_consumer for group orders" in root.body["text"] and "thread_ts" not in root.body
    assert action_reply.body["thread_ts"] == root.ts and action_reply.body["channel"] == "C0LAGDOC"
    assert "crashed_consumer for group payments" in other.body["text"] and "thread_ts" not in other.body
    assert update.body["thread_ts"] == root.ts and "severity warning → critical" in update.body["text"]
    assert "thread_ts" not in notice.body and "&lt;!channel&gt;" in notice.body["blocks"][0]["text"]["text"]
    # Nothing more to send: the next call delivers nothing twice.
    assert deliver_pending() == {"undelivered": 0, "delivery_error": None}
    assert post_action_result(action("orders"))["decision"] == "unchanged"
    assert len(server.posts) == 5
    assert (ThreadStore().open_threads("prod", "orders", "orders.v1")[0].thread_ts == root.ts)
    out, err = capfd.readouterr()
    assert SLACK_TEST_TOKEN not in out + err


def test_a_rerun_of_the_same_run_posts_nothing_twice(settings, slack_connection):
    server = slack_connection
    server.fail_all(503)  # the first try of the run cannot deliver: the retry must not queue again

    def run(run_id: str) -> None:
        post_or_update_incident(finding("orders"), run_id=run_id, now=T0)
        post_action_result(action("orders", key=f"{run_id}-k"))
        post_incident_run([{"finding": finding("payments", "stalled_consumer"), "plan": None}],
                          run_id=f"manual__{run_id}", scope="prod", now=T0)

    run("r1")
    server.heal()
    run("r1")  # a retried task, or a cleared and re-run DAG run
    run("r1")
    assert len(server.posts) == 4  # incident, its action reply, run header, the run's one finding
    assert len(set(texts(server))) == 4
    header = next(p for p in server.posts if "Incident run" in p.body["text"])
    inside = [p for p in server.posts if p.body.get("thread_ts") == header.ts]
    assert len(inside) == 1 and "stalled_consumer" in inside[0].body["text"]
    assert pending_messages(ThreadStore().db) == []


def _race_worker(run_id: str, barrier, results) -> None:
    # A fresh interpreter (spawn): its own engine, its own Slack client.
    barrier.wait(timeout=120)
    result = post_or_update_incident(finding("orders", "crashed_consumer", "critical"), run_id=run_id, now=T0)
    results.put(result["decision"])


def test_two_incident_runs_racing_on_one_group_open_one_thread(settings, slack_connection):
    # The database exists before the race, as after any first run. (Two processes
    # creating a fresh SQLite file at once can fail switching it to WAL: reported
    # against lagdoctor.state, not what this test is about.)
    ThreadStore()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(f"manual__{i}", barrier, results)) for i in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    decisions = sorted(results.get(timeout=5) for _ in procs)
    assert decisions == ["posted", "unchanged"]
    (post,) = slack_connection.posts
    assert "thread_ts" not in post.body and "crashed_consumer for group orders" in post.body["text"]
    assert len(list(ThreadStore().all())) == 1


def test_a_broker_outage_failing_three_runs_is_one_thread_and_one_recovery(settings, slack_connection):
    server = slack_connection
    dag = "kafka_lag_health_sweep"
    reason = RuntimeError(f"cannot reach Kafka at 127.0.0.1:9092 within 30 s (token {SLACK_TEST_TOKEN})")
    for i in range(3):
        run_id = f"scheduled__2026-11-21T10:{i * 5:02d}"
        result = notify_failure({"ti": TI(dag, "snapshot", run_id), "run_id": run_id, "exception": reason})
        assert result["decision"] == ("posted" if i == 0 else "unchanged")
    (root,) = server.posts
    assert "kafka_lag_health_sweep" in root.body["text"] and "snapshot" in root.body["text"]
    assert "cannot reach Kafka at 127.0.0.1:9092" in root.body["blocks"][0]["text"]["text"]
    assert SLACK_TEST_TOKEN not in json.dumps(root.body)
    assert result["failed_runs"] == 3 and result["repeats"] == 2

    recovered = notify_recovery({"dag": type("D", (), {"dag_id": dag})(), "run_id": "scheduled__2026-11-21T10:15"})
    assert recovered["decision"] == "recovered"
    root, reply = server.posts
    assert reply.body["thread_ts"] == root.ts
    assert "recovered after 3 failed run(s)" in reply.body["text"]
    # A second success says nothing; the next failure is a new story, a new thread.
    assert notify_recovery({"dag": type("D", (), {"dag_id": dag})(), "run_id": "x"})["decision"] == "unchanged"
    notify_failure({"ti": TI(dag, "diagnose", "r9"), "run_id": "r9", "exception": RuntimeError("exit 3")})
    assert len(server.posts) == 3 and "thread_ts" not in server.posts[-1].body


def test_a_failure_that_changes_replies_once_in_the_dag_thread(settings, slack_connection):
    server = slack_connection
    dag = "kafka_lag_incident"
    notify_failure({"ti": TI(dag, "snapshot", "m1"), "run_id": "m1", "exception": RuntimeError("broker down")})
    notify_failure({"ti": TI(dag, "diagnose", "m2"), "run_id": "m2", "exception": RuntimeError("exit 3")})
    notify_failure({"ti": TI(dag, "diagnose", "m3"), "run_id": "m3", "exception": RuntimeError("exit 3")})
    root, changed = server.posts
    assert changed.body["thread_ts"] == root.ts and "diagnose" in changed.body["text"]
    assert "2 failed run(s)" in json.dumps(changed.body["blocks"])


def test_failure_notice_during_a_slack_outage_waits_and_is_not_raised(settings, slack_connection):
    server = slack_connection
    server.fail_all(500)
    result = notify_failure({"ti": TI("kafka_lag_health_sweep", "snapshot", "r1"), "run_id": "r1",
                             "exception": RuntimeError("broker down")})
    assert result["undelivered"] == 1 and "service_unavailable" in result["delivery_error"]
    server.heal()
    recovered = notify_recovery({"ti": TI("kafka_lag_health_sweep", "post_findings", "r2"), "run_id": "r2"})
    assert recovered["undelivered"] == 0
    root, reply = server.posts
    assert "broker down" in root.body["blocks"][0]["text"]["text"] and reply.body["thread_ts"] == root.ts


def test_a_worker_stalled_past_its_lease_does_not_resend_what_another_worker_sent(settings, slack_connection):
    import sqlalchemy as sa

    from lagdoctor.notify import outbox
    from lagdoctor.notify.slack import ProviderSlackSender
    from lagdoctor.state import leases, state_db

    server = slack_connection
    db = state_db(settings)
    with db.transaction() as conn:
        for n, text in enumerate(("first", "second", "third")):
            outbox.queue_message(db, conn, dedupe_key=f"m{n}", text=text, blocks=[], now=T0)

    class StallsOnFirstSend(ProviderSlackSender):
        stalled = False

        def post(self, **kwargs):
            if not self.stalled:
                self.stalled = True
                # Stuck past the 5-minute lease: it expires, another worker delivers everything.
                with db.transaction() as conn:
                    conn.execute(sa.update(leases).values(expires_at=T0 - timedelta(days=1)))
                assert outbox.deliver_pending(db, ProviderSlackSender()).sent == 3
            return super().post(**kwargs)

    stalled = outbox.deliver_pending(db, StallsOnFirstSend())
    assert stalled.undelivered == 0 and stalled.error is None
    sent = [m["text"] for m in server.messages]
    # Only the message in flight during the stall goes twice (at-least-once, documented);
    # the rest of the stalled worker's list was re-checked before each send.
    assert sent == ["first", "second", "third", "first"]


def test_unknown_is_not_recovery(settings, slack_connection):
    server = slack_connection
    post_or_update_incident(finding("orders"), run_id="r1", now=T0)
    unknown = finding("orders", "healthy", "ok", lag=0, data_complete=False, read_errors=["orders.v1/1: timed out"])
    first = post_or_update_incident(unknown, run_id="r2", now=T0 + timedelta(minutes=5))
    again = post_or_update_incident(unknown, run_id="r3", now=T0 + timedelta(minutes=10))
    assert (first["decision"], first["replied"], again["replied"]) == ("incomplete", 1, 0)
    root, note = server.posts
    assert note.body["thread_ts"] == root.ts and "Data incomplete" in note.body["blocks"][0]["text"]["text"]
    assert "orders.v1/1: timed out" in note.body["blocks"][0]["text"]["text"]
    assert [t["status"] for t in first["threads"]] == ["open"]
    # Data complete again and healthy: now it is a recovery, in the same thread.
    done = post_or_update_incident(finding("orders", "healthy", "ok", lag=0), run_id="r4",
                                   now=T0 + timedelta(minutes=15))
    assert done["decision"] == "recovered" and server.posts[-1].body["thread_ts"] == root.ts
    assert "Recovered" in server.posts[-1].body["text"]
    # Unknown data with no open thread posts nothing.
    assert post_or_update_incident(unknown, run_id="r5", now=T0)["decision"] == "incomplete"
    assert len(server.posts) == 3


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")  # the point of this test
def test_a_message_slack_refuses_for_itself_does_not_block_the_ones_after_it(settings, slack_connection, caplog):
    server = slack_connection
    refused = post_notice({"text": "", "blocks": []}, dedupe_key="empty")  # Slack answers no_text
    assert refused == {"decision": "queued", "undelivered": 0, "delivery_error": None}
    after = post_or_update_incident(finding("orders"), run_id="r1", now=T0)
    assert after["undelivered"] == 0
    (posted,) = server.posts
    assert "slow_consumer for group orders" in posted.body["text"]
    assert [r.body.get("text") for r in server.requests] == ["", posted.body["text"]]  # never retried
    assert "no_text" in caplog.text


def test_a_reply_whose_channel_was_archived_goes_top_level_and_blocks_nothing(settings, slack_connection):
    """Threads outlive channels: a reply Slack cannot place must not hold every later message back."""
    server = slack_connection
    post_or_update_incident(finding("orders"), run_id="r1", now=T0)
    (root,) = server.posts
    # The thread's channel (by the id Slack gave it) is archived; the configured one still works.
    server.archived.add("C0LAGDOC")
    reply = post_action_result(action("orders"))
    later = post_or_update_incident(finding("payments", "crashed_consumer", "critical"), run_id="r1", now=T0)
    assert reply["undelivered"] == 0 and later["undelivered"] == 0
    _, moved, other = server.posts
    assert "thread_ts" not in moved.body and "scale" in moved.body["text"]  # top-level, in the default channel
    assert moved.body["channel"] != "C0LAGDOC"
    assert "crashed_consumer for group payments" in other.body["text"]
    assert pending_messages(ThreadStore().db) == []


def _plans(tmp_path, name: str, group_ids: list[str]) -> str:
    """A sweep's plans.json as the plan task leaves it, one problem per group."""
    folder = tmp_path / "data" / "findings" / name
    folder.mkdir(parents=True)
    items = [{"finding": finding(g), "plan": {"actions": [], "next_steps": []}} for g in group_ids]
    (folder / "plans.json").write_text(json.dumps(items))
    return str(folder / "plans.json")


def groups(slack_texts) -> list[str]:
    """The group each message is about, in the order given."""
    return [re.search(r"for group (\S+)", t).group(1) for t in slack_texts]


def test_a_rate_limit_past_the_budget_waits_for_the_next_run_in_order_once(settings, slack_connection, tmp_path,
                                                                          monkeypatch, caplog):
    """Slack 429s a sweep's post. Retry-After within the task's budget is waited out; past it the rest
    waits in the outbox, said once in the task log, and the task does not fail (a failed task pages
    people and retries everything). The next run sends what waited first, in order, then its own:
    each message once."""
    from lagdoctor.notify import outbox
    from lagdoctor.stages.notify import post_findings

    waited: list[float] = []
    monkeypatch.setattr(outbox, "_sleep", waited.append)  # record the waits: no wall clock here
    server = slack_connection
    server.fail_next(429, retry_after=2)  # within the budget: waited out, then sent
    server.rate_limit(retry_after=60, after=1)  # then more than this task may wait: the rest waits
    caplog.set_level(logging.INFO)

    summary = post_findings(_plans(tmp_path, "sweep-1", ["g1", "g2", "g3"]), "scheduled__1", now=T0)

    assert summary == {"posted": 3}  # the task succeeds: every finding was decided and queued
    assert waited == [2.0]
    assert groups(texts(server)) == ["g1"]
    said = [r.getMessage() for r in caplog.records if "outbox" in r.getMessage()]
    assert said == ["Slack: 2 message(s) wait in the outbox, in order, for the next run: rate limited: Slack asked "
                    "to wait 60 s, more than the 13 s left of this task's 15 s budget"]
    assert [r.levelname for r in caplog.records if r.getMessage() in said] == ["WARNING"]
    assert groups(m["text"] for m in pending_messages(ThreadStore().db)) == ["g2", "g3"]

    # The next run: Slack is fine again. What waited goes first, in order, then the run's own news.
    server.heal()
    caplog.clear()
    post_findings(_plans(tmp_path, "sweep-2", ["g4"]), "scheduled__2", now=T0 + timedelta(minutes=1))
    assert groups(texts(server)) == ["g1", "g2", "g3", "g4"]
    assert [r.status for r in server.requests] == [429, 200, 429, 200, 200, 200]
    assert pending_messages(ThreadStore().db) == []
    assert not [r for r in caplog.records if "outbox" in r.getMessage()]
    # A retried task of either run sends nothing twice.
    post_findings(_plans(tmp_path, "sweep-2b", ["g4"]), "scheduled__2", now=T0 + timedelta(minutes=1))
    assert len(server.posts) == 4
