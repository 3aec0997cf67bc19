"""Incident threads end to end: decision rules, durable state, Slack and the outbox.

Every test that keeps state runs against SQLite and PostgreSQL (``state_url``)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

# Airflow reconfigures logging on first import; do it before caplog attaches.
import airflow.sdk  # noqa: F401
from airflow.providers.slack.hooks.slack import SlackHook  # noqa: F401

from lagdoctor.notify import notify_failure, post_action_result, post_or_update_incident, slack_sender
from lagdoctor.notify.slack import OutboxSender, ProviderSlackSender, SlackDeliveryError
from lagdoctor.notify.threads import IncidentKey, ThreadState, ThreadStore, decide, decide_healthy
from lagdoctor.settings import Settings
from lagdoctor.state import dispose_engines
from tests.fixtures.slack import SLACK_TEST_TOKEN, slack_connection, slack_server  # noqa: F401

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def finding(diagnosis="slow_consumer", severity="warning", pattern="steady_climb", lag=1000, partitions=(0, 1), **kw):
    base = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partitions": list(partitions),
            "diagnosis": diagnosis, "pattern": pattern, "severity": severity, "summary": f"lag {lag}",
            "evidence": {"lag_total": lag}, "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}
    return {**base, **kw}


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("AIRFLOW_CONN_SLACK_API_DEFAULT", raising=False)
    return Settings.from_env()


def all_logs(caplog, capfd) -> str:
    # Airflow routes stdlib logging through structlog to stdout once imported: read both.
    out, err = capfd.readouterr()
    return caplog.text + out + err


def state_for(f, **kw) -> ThreadState:
    s = ThreadState(key=IncidentKey.of(f), channel="C1", thread_ts="1.1", severity=f["severity"],
                    pattern=f["pattern"], partitions=list(f["partitions"]), lag_total=f["evidence"]["lag_total"],
                    last_run_id="run-1")
    for k, v in kw.items():
        setattr(s, k, v)
    return s


# (current finding, thread state, expected decision, why)
RULES = [
    (finding(), None, "post", "1: no thread yet"),
    (finding(), state_for(finding(), status="closed"), "post", "1: a closed incident that returns is a new thread"),
    (finding(severity="critical"), state_for(finding(), last_run_id="run-2"), "nothing", "2: a retried task of the same run"),
    (finding(severity="critical"), state_for(finding()), "reply", "3: severity rose"),
    (finding(severity="warning"), state_for(finding(severity="critical")), "nothing",
     "3: severity fell back: hysteresis, said with the next material change or the recovery"),
    (finding(severity="critical"), state_for(finding(severity="warning"), told_partitions=[0, 1]), "reply",
     "3: it rose again after an unsaid fall: the thread still says warning"),
    (finding(pattern="explosion"), state_for(finding()), "nothing", "3: a new lag pattern alone is not news"),
    (finding(partitions=(0, 1, 4)), state_for(finding()), "reply", "3: a partition never named is involved"),
    (finding(partitions=(1,)), state_for(finding()), "nothing", "3: fewer partitions: hysteresis, not news"),
    (finding(partitions=(0, 1, 2)), state_for(finding(partitions=(1,)), told_partitions=[0, 1, 2]), "nothing",
     "3: a set that shrank and grew back names nothing new (data-loss [1] <-> [0, 1, 2] flapping)"),
    (finding(lag=2000), state_for(finding()), "reply", "3: lag doubled by 1,000 or more"),
    (finding(lag=20_000), state_for(finding(lag=50_000)), "reply", "3: lag more than halved (draining)"),
    (finding(lag=400), state_for(finding()), "nothing", "3: halved by 600: below LAG_MATERIAL_MIN"),
    (finding(lag=73), state_for(finding(lag=4)), "nothing", "3: 4 -> 73 is a flap, not news"),
    (finding(lag=1900), state_for(finding()), "nothing", "4: lag moved but not 2x: no repeat every sweep"),
    (finding(lag=5000), state_for(finding(lag=2000), updated_at=(T0 - timedelta(minutes=5)).isoformat()),
     "nothing", "3: a lag-only change 5 min after the last reply waits (one per quarter hour)"),
    (finding(lag=5000), state_for(finding(lag=2000), updated_at=(T0 - timedelta(minutes=16)).isoformat()),
     "reply", "3: a lag-only change 16 min after the last reply is said"),
    (finding(lag=5000, severity="critical"),
     state_for(finding(lag=2000), updated_at=(T0 - timedelta(minutes=5)).isoformat()),
     "reply", "3: a severity rise is said at once, whatever the last reply's age"),
    (finding(summary="other words"), state_for(finding()), "nothing", "4: a reworded summary alone is not news"),
    (finding(), state_for(finding(), provisional=True, deciding_between=["slow_consumer", "producer_surge"]),
     "decided", "7: the thread said provisional, this finding is decided"),
    (finding(provisional=True, deciding_between=["slow_consumer", "producer_surge"]),
     state_for(finding(), provisional=True, deciding_between=["slow_consumer", "producer_surge"]),
     "nothing", "7: still provisional, nothing new: no repeat every sweep"),
]


@pytest.mark.parametrize("current,state,expected,why", RULES, ids=[r[3] for r in RULES])
def test_decision_rules(current, state, expected, why):
    assert decide(current, state, run_id="run-2", now=T0).kind == expected


def healthy(complete=True, **kw):
    f = finding("healthy", "ok", lag=0, **kw)
    if not complete:
        f["evidence"] = {"lag_total": 0, "data_complete": False}
    return f


# (healthy finding, open thread, expected decision, why)
HEALTHY_RULES = [
    (healthy(), state_for(finding()), "recover", "5: a complete healthy finding closes the thread"),
    (healthy(complete=False), state_for(finding()), "incomplete", "6: unknown is not recovery: say so once"),
    (healthy(complete=False), state_for(finding(), data_incomplete=True), "nothing",
     "6: already told the data is incomplete: no repeat every sweep"),
]


@pytest.mark.parametrize("current,state,expected,why", HEALTHY_RULES, ids=[r[3] for r in HEALTHY_RULES])
def test_healthy_decision_rules(current, state, expected, why):
    assert decide_healthy(current, state).kind == expected


def test_state_is_durable_in_the_state_database(settings):
    key = IncidentKey("prod", "we/ird group", "t", "slow_consumer")
    ThreadStore().save(ThreadState(key=key, channel="C1", thread_ts="1.000001"))
    dispose_engines()  # a new process would read the same
    again = ThreadStore().get(key)
    assert again.thread_ts == "1.000001" and again.status == "open" and again.key.group_id == "we/ird group"
    assert [s.key for s in ThreadStore().all()] == [key]
    assert not (Path(settings.data_root) / "incidents").exists()


def test_without_slack_connection_messages_go_to_the_outbox_and_the_log(settings, caplog, capfd):
    caplog.set_level(logging.INFO)
    result = post_or_update_incident(finding(), {"next_steps": ["look"]}, run_id="run-1", now=T0)
    assert result["decision"] == "posted"
    outbox = Path(settings.data_root) / "outbox" / "slack.jsonl"
    (entry,) = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert entry["blocks"][0]["type"] == "header" and entry["thread_ts"] is None
    assert "slow_consumer for group orders" in all_logs(caplog, capfd)
    # The outbox threads like Slack: the recovery goes to the same thread.
    post_or_update_incident(finding("healthy", "ok"), run_id="run-2", now=T0 + timedelta(minutes=5))
    entries = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert entries[1]["thread_ts"] == entry["ts"]
    assert not (Path(settings.data_root) / "incidents").exists(), "thread state belongs in the state database"


def test_thread_lifecycle_against_slack(settings, slack_connection):
    server = slack_connection
    sweeps = [
        ("run-1", finding(), "posted"),
        ("run-2", finding(lag=1100), "unchanged"),
        ("run-3", finding(severity="critical", lag=5000), "replied"),
        ("run-4", finding(severity="critical", lag=5200), "unchanged"),
        ("run-5", finding("healthy", "ok", lag=0), "recovered"),
        ("run-6", finding("healthy", "ok", lag=0), "healthy"),
    ]
    for i, (run_id, f, expected) in enumerate(sweeps):
        result = post_or_update_incident(f, None, run_id=run_id, now=T0 + timedelta(minutes=5 * i))
        assert result["decision"] == expected, run_id
    first, update, recovery = server.messages
    assert "thread_ts" not in first and first["channel"] == "#kafka-lag"
    root_ts = server.posts[0].ts
    assert update["thread_ts"] == root_ts and recovery["thread_ts"] == root_ts
    assert "severity warning → critical" in update["text"]
    assert "total lag 1,000 → 5,000" in update["text"]
    assert "Recovered" in recovery["blocks"][0]["text"]["text"] and "20m" in recovery["blocks"][0]["text"]["text"]
    # After recovery the same problem opens a new thread.
    assert post_or_update_incident(finding(), None, run_id="run-7", now=T0 + timedelta(hours=1))["decision"] == "posted"
    assert "thread_ts" not in server.messages[-1]


def test_recovery_closes_every_open_diagnosis_of_the_group_and_topic(settings, slack_connection):
    post_or_update_incident(finding("slow_consumer"), run_id="r1", now=T0)
    post_or_update_incident(finding("rebalance_loop"), run_id="r1", now=T0)
    post_or_update_incident(finding("slow_consumer", topic="other"), run_id="r1", now=T0)
    result = post_or_update_incident(finding("healthy", "ok"), run_id="r2", now=T0)
    assert sorted(t["diagnosis"] for t in result["threads"]) == ["rebalance_loop", "slow_consumer"]
    open_left = [s for s in ThreadStore().all() if s.status == "open"]
    assert [s.key.topic for s in open_left] == ["other"]


def test_a_cause_that_changes_between_sweeps_stays_in_one_thread(settings, slack_connection):
    """Rule 10. Seen live: 10 top-level messages for six incidents, a cause named wrong first (slow
    consumer) and right a sweep later (producer surge) opening a second thread."""
    slow = finding("slow_consumer", "warning", lag=3000)
    surge = finding("producer_surge", "critical", lag=5000)
    post_or_update_incident(slow, run_id="r1", now=T0, sweep=[slow])
    result = post_or_update_incident(surge, run_id="r2", now=T0 + timedelta(minutes=1), sweep=[surge])
    assert result["decision"] == "replied" and result["joined"] == "slow_consumer"
    root = slack_connection.posts[0]
    reply = slack_connection.messages[-1]
    assert reply["thread_ts"] == root.ts and "Cause changed:* slow consumer → producer surge" in json.dumps(reply, ensure_ascii=False)
    assert post_or_update_incident(surge, run_id="r3", now=T0 + timedelta(minutes=2),
                                   sweep=[surge])["decision"] == "unchanged"
    recovered = post_or_update_incident(healthy(), run_id="r4", now=T0 + timedelta(minutes=3))
    assert recovered["decision"] == "recovered"
    assert len([m for m in slack_connection.messages if not m.get("thread_ts")]) == 1
    assert len(slack_connection.messages) == 3
    assert [s.status for s in ThreadStore().all()] == ["closed"]


def test_two_causes_at_once_share_one_thread_and_one_recovery(settings, slack_connection):
    """Rule 10 ("the truth is a set"): an imbalance and a rebalance loop found by one sweep."""
    imbalance = finding("partition_imbalance", "critical", partitions=(1,), lag=5000)
    loop = finding("rebalance_loop", "warning", partitions=(), lag=5000)
    for f in (imbalance, loop):
        post_or_update_incident(f, run_id="r1", now=T0, sweep=[imbalance, loop])
    also = slack_connection.messages[-1]
    assert also["thread_ts"] == slack_connection.posts[0].ts
    assert "Also:* rebalance loop (beside partition imbalance, still open)" in json.dumps(also)
    for f in (imbalance, loop):  # the next sweep, nothing new
        assert post_or_update_incident(f, run_id="r2", now=T0 + timedelta(minutes=1),
                                       sweep=[imbalance, loop])["decision"] == "unchanged"
    post_or_update_incident(healthy(), run_id="r3", now=T0 + timedelta(minutes=2))
    assert len(slack_connection.messages) == 3  # the post, "Also", one recovery
    assert sorted(s.status for s in ThreadStore().all()) == ["closed", "closed"]


def test_action_result_replies_once_in_the_incident_thread(settings, slack_connection):
    post_or_update_incident(finding(), run_id="r1", now=T0)
    record = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "diagnosis": "slow_consumer",
              "idempotency_key": "k1", "action": "scale_consumers", "status": "dry_run",
              "message": "would scale shop/orders from ~2 by +1 replicas, never above 6 partitions"}
    assert post_action_result(record)["decision"] == "replied"
    assert post_action_result(record)["decision"] == "unchanged"  # a retried task
    reply = slack_connection.messages[-1]
    assert reply["thread_ts"] == slack_connection.posts[0].ts
    assert "dry run" in reply["blocks"][0]["text"]["text"]
    assert len(slack_connection.messages) == 2


def test_a_sweep_every_minute_says_a_blocked_action_once_and_again_only_when_its_reason_changes(
        settings, slack_connection):
    """Seen live: `restart_consumers blocked ... no Deployment mapped` replied 12 times in 16 minutes.
    Twelve one-minute sweeps of one crashed group, each running the action through the real runner:
    one reply; a mapping added changes what is said (a dry run), once; a real outcome is said once."""
    from lagdoctor.remediation import run_action
    from lagdoctor.remediation.config import Deployment, RemediationConfig

    crashed = finding("crashed_consumer", "critical", partitions=(), lag=4036)
    unmapped = RemediationConfig()
    mapped = RemediationConfig(deployments={"orders": Deployment(namespace="shop", name="orders")})

    def sweep(i: int, config: RemediationConfig) -> dict:
        run_id = f"scheduled__2026-11-21T10:{i:02d}:00+00:00"
        at = T0 + timedelta(minutes=i)
        post_or_update_incident(crashed, run_id=run_id, now=at)
        record = run_action("restart_consumers", crashed, run_id=run_id, dry_run=True, config=config, now=at)
        return post_action_result(record, now=at)

    decisions = [sweep(i, unmapped)["decision"] for i in range(12)]
    assert decisions == ["replied"] + ["unchanged"] * 11
    replies = [m for m in slack_connection.messages if m.get("thread_ts")]
    assert len(replies) == 1 and "no Deployment mapped" in replies[0]["text"]

    assert [sweep(i, mapped)["decision"] for i in range(12, 15)] == ["replied", "unchanged", "unchanged"]
    replies = [m for m in slack_connection.messages if m.get("thread_ts")]
    assert len(replies) == 2 and "dry run" in replies[1]["blocks"][0]["text"]["text"]

    executed = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "diagnosis": "crashed_consumer",
                "idempotency_key": "real-1", "action": "restart_consumers", "status": "executed",
                "message": "restarted shop/orders"}
    assert post_action_result(executed, now=T0 + timedelta(minutes=16))["decision"] == "replied"
    assert post_action_result(executed, now=T0 + timedelta(minutes=16))["decision"] == "unchanged"  # a retry
    # after an outcome, what the sweep proposes is news again, once
    assert [sweep(i, mapped)["decision"] for i in range(17, 19)] == ["replied", "unchanged"]
    assert len([m for m in slack_connection.messages if m.get("thread_ts")]) == 4
    assert len([m for m in slack_connection.messages if not m.get("thread_ts")]) == 1  # one top-level message


def test_an_action_said_in_the_thread_is_not_said_again_when_the_cause_changes(settings, slack_connection):
    """Seen in the noise lab: `scale_consumers blocked ... no Deployment mapped` replied under slow_consumer,
    then again after "Cause changed: slow consumer -> producer surge". The same words are not news."""
    from lagdoctor.remediation import run_action
    from lagdoctor.remediation.config import RemediationConfig

    slow = finding("slow_consumer", "critical", partitions=(0, 1), lag=5000)
    post_or_update_incident(slow, run_id="run-1", now=T0)
    record = run_action("scale_consumers", slow, run_id="run-1", dry_run=True, config=RemediationConfig(), now=T0)
    assert post_action_result(record, now=T0)["decision"] == "replied"
    later = T0 + timedelta(minutes=1)
    surge = finding("producer_surge", "critical", partitions=(), lag=9000)
    assert post_or_update_incident(surge, run_id="run-2", now=later, sweep=[surge])["decision"] == "replied"
    record = run_action("scale_consumers", surge, run_id="run-2", dry_run=True, config=RemediationConfig(), now=later)
    assert post_action_result(record, now=later)["decision"] == "unchanged"
    said = [m["text"] for m in slack_connection.messages]
    assert sum("no Deployment mapped" in t for t in said) == 1 and any("Cause changed" in t for t in said)

def test_server_errors_are_retried_by_slack_sdk_and_a_rate_limit_is_handed_to_the_outbox(settings, slack_connection):
    """A 503 is retried by slack-sdk's handler; a 429 is not: the outbox waits out its Retry-After
    within the task's budget (test_faults_slack), so the sender says how long Slack asked to wait."""
    server = slack_connection
    server.fail_next(503)
    sender = slack_sender()
    assert isinstance(sender, ProviderSlackSender)
    posted = sender.post(text="hello", blocks=[])
    assert posted.channel == "C0LAGDOC" and posted.ts
    assert [r.status for r in server.requests] == [503, 200]
    server.fail_next(429, retry_after=7)
    with pytest.raises(SlackDeliveryError) as err:
        sender.post(text="again", blocks=[])
    assert (err.value.reason, err.value.retry_after, err.value.rejected) == ("ratelimited", 7.0, False)
    assert str(err.value) == "Slack rate limit (Retry-After 7 s)"
    assert [r.status for r in server.requests] == [503, 200, 429]
    assert len(server.messages) == 1


def test_a_known_token_appears_in_no_log_line_message_or_error(settings, slack_connection, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("lagdoctor.notify.slack_client").setLevel(logging.DEBUG)
    server = slack_connection
    post_or_update_incident(finding(), {"next_steps": ["x"]}, run_id="r1", now=T0)
    for _ in range(3):  # more 503s than the handler retries: the post fails, and waits in the outbox
        server.fail_next(503)
    result = post_or_update_incident(finding(severity="critical"), run_id="r2", now=T0)
    assert result["decision"] == "replied" and result["undelivered"] == 1
    error = result["delivery_error"]
    assert "\n" not in error and "service_unavailable" in error
    assert server.requests[0].headers["Authorization"] == f"Bearer {SLACK_TEST_TOKEN}"  # it was really used
    logs = all_logs(caplog, capfd)
    assert "Sending a request" in logs, "the Slack client's debug log was not captured"
    assert SLACK_TEST_TOKEN not in logs
    assert SLACK_TEST_TOKEN not in error
    assert all(SLACK_TEST_TOKEN not in json.dumps(r.body) for r in server.requests)
    for path in Path(settings.data_root).rglob("*"):
        if path.is_file() and "state" not in path.parts:
            assert SLACK_TEST_TOKEN not in path.read_text()
    from lagdoctor.notify.outbox import pending_messages

    (waiting,) = pending_messages(ThreadStore().db)
    assert waiting["attempts"] == 1 and SLACK_TEST_TOKEN not in waiting["last_error"]


def test_failure_callback_posts_through_the_outbox_to_slack(settings, slack_connection):
    class TI:
        dag_id, task_id, run_id = "kafka_lag_health_sweep", "diagnose", "scheduled__x"

    notify_failure({"ti": TI(), "run_id": "scheduled__x", "exception": RuntimeError("spark-submit exited 1\nstack")})
    (msg,) = slack_connection.messages
    assert "kafka_lag_health_sweep" in msg["text"] and "diagnose" in msg["text"]
    assert "spark-submit exited 1 stack" in msg["blocks"][0]["text"]["text"]


def _context(dag_id: str, task_id: str, run_id: str, exception: Exception | None = None, **extra) -> dict:
    class TI:
        pass

    ti = TI()
    ti.dag_id, ti.task_id, ti.run_id = dag_id, task_id, run_id
    return {"ti": ti, "run_id": run_id, **({"exception": exception} if exception else {}), **extra}


def test_a_failure_is_said_once_the_run_has_failed_naming_the_task_that_failed_first(settings, slack_connection):
    """Seen live: `kafka_lag_incident failed` posted in the same second as `Approval needed`, while the run
    still waited for a human. A task's failure is remembered; the run's failure is said, once."""
    from lagdoctor.notify import notify_recovery, notify_run_failed, record_task_failure

    sweep = "kafka_lag_health_sweep"
    record_task_failure(_context(sweep, "diagnose", "scheduled__1", RuntimeError("spark-submit exited 1")))
    record_task_failure(_context(sweep, "remediate_restart_consumers", "scheduled__1", RuntimeError("blocked")))
    assert slack_connection.messages == []  # the run has not failed yet
    notify_run_failed(_context(sweep, "check_failures", "scheduled__1", reason="task_failure"))
    (msg,) = slack_connection.messages
    text = msg["blocks"][0]["text"]["text"]
    assert "diagnose" in msg["text"] and "spark-submit exited 1" in text
    assert "also failed: remediate_restart_consumers" in text

    # a task failed, but the run tolerated it and succeeded: nothing is said of that task,
    # and the open failure thread gets its one recovery reply
    record_task_failure(_context(sweep, "write_reports", "scheduled__2", RuntimeError("disk full")))
    notify_recovery(_context(sweep, "post_findings", "scheduled__2"))
    assert len(slack_connection.messages) == 2 and "disk full" not in json.dumps(slack_connection.messages)
    # nor later, when another run fails for its own reason
    notify_run_failed(_context(sweep, "snapshot", "scheduled__3", RuntimeError("x"), reason="task_failure"))
    assert "disk full" not in json.dumps(slack_connection.messages)


def test_an_incident_runs_failure_goes_to_the_runs_own_thread(settings, slack_connection):
    from lagdoctor.notify import notify_run_failed, post_incident_run, record_task_failure

    dag = "kafka_lag_incident"
    post_incident_run([{"finding": finding(), "plan": None}], run_id="manual__7", scope="prod", now=T0)
    header = slack_connection.posts[0]
    record_task_failure(_context(dag, "restart_consumers", "manual__7", RuntimeError("lease held by another run")))
    notify_run_failed(_context(dag, "check_failures", "manual__7", reason="task_failure"))
    last = slack_connection.posts[-1]
    assert last.body["thread_ts"] == header.ts and "lease held by another run" in last.body["blocks"][0]["text"]["text"]
    assert len([p for p in slack_connection.posts if "thread_ts" not in p.body]) == 1  # no DAG failure thread


def test_failure_callback_without_slack_writes_the_outbox_and_never_raises(settings):
    class TI:
        dag_id, task_id, run_id = "kafka_lag_incident", "snapshot", "manual__1"

    notify_failure({"ti": TI()})
    assert isinstance(slack_sender(), OutboxSender)
    outbox = Path(settings.data_root) / "outbox" / "slack.jsonl"
    assert "kafka_lag_incident" in outbox.read_text()


def provisional(diagnosis="partition_imbalance", between=("partition_imbalance", "stalled_consumer"), **kw):
    return finding(diagnosis, "critical", partitions=(1,), lag=5000, provisional=True, deciding_between=list(between),
                   decided_by="2026-11-21T10:10:00Z", samples_needed=2,
                   undecided_because="the commit on partition 1 has stood still for 1m00s", **kw)


def test_a_provisional_incident_is_decided_in_the_same_thread_without_a_diagnosis_change(settings, slack_connection):
    server = slack_connection
    first = post_or_update_incident(provisional(), None, run_id="run-1", now=T0)
    assert first["decision"] == "posted"
    # the next sweep decides the other candidate: a reply in that thread, not a new thread
    decided = finding("stalled_consumer", "critical", partitions=(1,), lag=5000, provisional=False,
                      deciding_between=[], summary="partition 1 stopped committing")
    second = post_or_update_incident(decided, None, run_id="run-2", now=T0 + timedelta(minutes=5))
    assert second["decision"] == "replied" and second["decided"] is True
    root, reply = server.messages
    assert "thread_ts" not in root and reply["thread_ts"] == server.posts[0].ts
    assert root["text"].startswith("orders: still deciding between partition imbalance and stalled consumer")
    assert "Decided" in reply["text"] and "stalled consumer" in reply["text"]
    body = json.dumps(reply)
    assert "Changed" not in body and "→" not in body
    # the thread now belongs to the decided cause: the next sweep of the same finding says nothing
    assert [s.key.diagnosis for s in ThreadStore().all() if s.status == "open"] == ["stalled_consumer"]
    third = post_or_update_incident(decided, None, run_id="run-3", now=T0 + timedelta(minutes=10))
    assert third["decision"] == "unchanged"
    # a change between decided causes (rule 10): the same thread says the cause changed, re-keyed to it
    other = finding("slow_consumer", "critical", partitions=(1,), lag=5000)
    changed = post_or_update_incident(other, None, run_id="run-4", now=T0 + timedelta(minutes=15), sweep=[other])
    assert changed["decision"] == "replied" and server.messages[-1]["thread_ts"] == server.posts[0].ts
    assert "Cause changed" in json.dumps(server.messages[-1]) and len(server.posts) == 3
    assert [s.key.diagnosis for s in ThreadStore().all() if s.status == "open"] == ["slow_consumer"]


def test_an_unsure_sweep_in_a_thread_that_named_its_cause_never_brings_a_decided_reply(settings, slack_connection):
    """The thread said partition imbalance; one sweep is unsure (provisional, same cause leading),
    the next is sure again: nothing said was provisional, so no "Decided:" reply, ever."""
    server = slack_connection
    named = finding("partition_imbalance", "critical", partitions=(1,), lag=5000, provisional=False)
    assert post_or_update_incident(named, None, run_id="run-1", now=T0)["decision"] == "posted"
    # unsure, and the lag grew tenfold (a lag-only reply, past its quarter hour): one about the growth,
    # which names no doubt
    unsure = finding("partition_imbalance", "critical", partitions=(1,), lag=60_000, provisional=True,
                     deciding_between=["partition_imbalance", "stalled_consumer"], decided_by="2026-11-21T10:20:00Z",
                     samples_needed=2, undecided_because="the commit on partition 1 has stood still for 1m00s")
    assert post_or_update_incident(unsure, None, run_id="run-2", now=T0 + timedelta(minutes=16))["decision"] == "replied"
    named_again = finding("partition_imbalance", "critical", partitions=(1,), lag=60_000, provisional=False)
    third = post_or_update_incident(named_again, None, run_id="run-3", now=T0 + timedelta(minutes=20))
    assert third.get("decided") is not True
    assert not any("Decided" in m["text"] for m in server.messages)
    assert [s.provisional for s in ThreadStore().all() if s.status == "open"] == [False]


def test_a_provisional_incident_confirmed_as_its_leading_cause_gets_the_decided_reply(settings, slack_connection):
    server = slack_connection
    post_or_update_incident(provisional(), None, run_id="run-1", now=T0)
    decided = finding("partition_imbalance", "critical", partitions=(1,), lag=5000, provisional=False)
    result = post_or_update_incident(decided, None, run_id="run-2", now=T0 + timedelta(minutes=5))
    assert result["decided"] is True
    root, reply = server.messages
    assert reply["thread_ts"] == server.posts[0].ts and "Decided" in reply["text"]
    assert "partition imbalance" in reply["text"]


def stalled(**kw):
    return finding("stalled_consumer", "critical", partitions=(1,), lag=5000, provisional=False,
                   summary="partition 1 stopped committing", **kw)


def test_an_action_posted_before_is_not_posted_again_after_a_provisional_thread_takes_its_key(settings,
                                                                                              slack_connection):
    """A stalled-consumer thread posted an action result and closed; a provisional thread later decides
    stalled_consumer and takes that key. The retried action task must still find its marker, even once
    retention removed the old Slack message (the outbox's own dedupe no longer knows it)."""
    from lagdoctor.state import prune_notifications

    server = slack_connection
    record = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "diagnosis": "stalled_consumer",
              "idempotency_key": "k1", "action": "restart_consumer", "status": "executed",
              "message": "restarted shop/orders-7"}
    assert post_or_update_incident(stalled(), None, run_id="run-1", now=T0)["decision"] == "posted"
    assert post_action_result(record, now=T0 + timedelta(minutes=1))["decision"] == "replied"
    healthy_again = post_or_update_incident(healthy(), None, run_id="run-2", now=T0 + timedelta(minutes=10))
    assert healthy_again["decision"] == "recovered"
    assert post_or_update_incident(provisional(), None, run_id="run-3",
                                   now=T0 + timedelta(minutes=15))["decision"] == "posted"
    prune_notifications(ThreadStore().db, T0 + timedelta(minutes=5))
    decided = post_or_update_incident(stalled(), None, run_id="run-4", now=T0 + timedelta(minutes=20))
    assert decided["decided"] is True
    # the retried action task of run-1
    assert post_action_result(record, now=T0 + timedelta(minutes=21))["decision"] == "unchanged"
    assert sum("restart_consumer" in json.dumps(m) for m in server.messages) == 1


def texts_in_thread(server, root_index: int) -> list[str]:
    ts = server.posts[root_index].ts
    return [m["blocks"][0]["text"]["text"] for m in server.messages if m.get("thread_ts") == ts]


def test_a_provisional_thread_whose_cause_turned_out_outside_its_candidates_is_closed_pointing_on(
        settings, slack_connection):
    """Deciding between partition imbalance and stalled consumer, then the group crashed: the crash gets
    its own thread, and the provisional one one closing reply, not left saying "still deciding"."""
    server = slack_connection
    assert post_or_update_incident(provisional(), None, run_id="run-1", now=T0)["decision"] == "posted"
    crashed = finding("crashed_consumer", "critical", partitions=(0, 1), lag=9000, provisional=False,
                      summary="no live members")
    result = post_or_update_incident(crashed, None, run_id="run-2", now=T0 + timedelta(minutes=5))
    assert result["decision"] == "posted" and result["superseded"] == ["partition_imbalance"]
    provisional_root, crash_root, closing = server.messages
    assert "thread_ts" not in crash_root and "crashed_consumer" in crash_root["text"]
    assert closing["thread_ts"] == server.posts[0].ts
    assert texts_in_thread(server, 0) == [
        ":arrow_right: *Now crashed consumer* (was still deciding between partition imbalance and stalled "
        "consumer): followed in its own thread. This thread is closed."]
    # the next sweep says nothing more anywhere, and no thread is left "still deciding"
    again = post_or_update_incident(crashed, None, run_id="run-3", now=T0 + timedelta(minutes=10))
    assert again["decision"] == "unchanged" and len(server.messages) == 3
    assert [(s.key.diagnosis, s.provisional) for s in ThreadStore().all() if s.status == "open"] == [
        ("crashed_consumer", False)]


def test_a_provisional_thread_decided_into_a_cause_another_open_thread_holds_is_closed_pointing_there(
        settings, slack_connection):
    server = slack_connection
    assert post_or_update_incident(stalled(), None, run_id="run-1", now=T0)["decision"] == "posted"
    # an unsure sweep with the other candidate leading: a thread of its own says "still deciding"
    assert post_or_update_incident(provisional(), None, run_id="run-2",
                                   now=T0 + timedelta(minutes=5))["decision"] == "posted"
    result = post_or_update_incident(stalled(), None, run_id="run-3", now=T0 + timedelta(minutes=10))
    assert result["decision"] == "unchanged" and result["superseded"] == ["partition_imbalance"]
    assert texts_in_thread(server, 1) == [
        ":white_check_mark: *Decided:* stalled consumer (was still deciding between partition imbalance and "
        "stalled consumer): followed in its existing thread, opened 10:00 UTC. This thread is closed."]
    assert texts_in_thread(server, 0) == [], "the stalled thread said it already: nothing twice"
    assert len(server.messages) == 3
    assert post_or_update_incident(stalled(), None, run_id="run-4",
                                   now=T0 + timedelta(minutes=15))["decision"] == "unchanged"
    assert len(server.messages) == 3
    assert [s.key.diagnosis for s in ThreadStore().all() if s.status == "open"] == ["stalled_consumer"]


def still_provisional(decided_by: str, **kw):
    f = provisional(**kw)
    f["decided_by"] = decided_by
    return f


def test_a_provisional_thread_says_once_per_new_promise_that_it_is_still_undecided_after_the_time_it_gave(
        settings, slack_connection):
    server = slack_connection
    sweeps = [  # (minutes after 10:00, decided_by of the sweep's finding, expected decision)
        (0, "2026-11-21T10:10:00Z", "posted"),
        (5, "2026-11-21T10:10:00Z", "unchanged"),   # before the promised 10:10
        (10, "2026-11-21T10:19:40Z", "replied"),    # the 10:10 sweep is still unsure: say so, and the new time
        (15, "2026-11-21T10:19:40Z", "unchanged"),  # the new promise stands
        (20, "2026-11-21T10:20:00Z", "unchanged"),  # 10:20 is the promise said: not a new one, nothing twice
        (25, "2026-11-21T10:31:00Z", "replied"),    # overdue again, with a new time: once more
        (30, "2026-11-21T10:31:00Z", "unchanged"),
    ]
    for i, (minutes, by, expected) in enumerate(sweeps):
        result = post_or_update_incident(still_provisional(by), None, run_id=f"run-{i}",
                                         now=T0 + timedelta(minutes=minutes))
        assert result["decision"] == expected, minutes
    replies = texts_in_thread(server, 0)
    assert replies == [
        ":hourglass: *Still deciding between partition imbalance and stalled consumer on orders.v1[1]:* not decided "
        "at the first sweep after 10:10 UTC as promised; will know at the first sweep after 10:20 UTC\n"
        "_Not decided yet because_ the commit on partition 1 has stood still for 1m00s",
        ":hourglass: *Still deciding between partition imbalance and stalled consumer on orders.v1[1]:* not decided "
        "at the first sweep after 10:20 UTC as promised; will know at the first sweep after 10:31 UTC\n"
        "_Not decided yet because_ the commit on partition 1 has stood still for 1m00s",
    ]
    (thread,) = [s for s in ThreadStore().all() if s.status == "open"]
    assert thread.provisional and thread.decided_by == "2026-11-21T10:31:00Z"
    decided = post_or_update_incident(stalled(), None, run_id="run-9", now=T0 + timedelta(minutes=35))
    assert decided["decided"] is True and "Decided" in server.messages[-1]["text"]
    (thread,) = [s for s in ThreadStore().all() if s.status == "open"]
    assert thread.decided_by is None and not thread.provisional


def test_a_provisional_thread_stored_before_decided_by_was_kept_learns_its_promise_from_the_next_sweep(
        settings, slack_connection):
    """A row written by the previous release has no decided_by in its data (the thread's fields live in
    the JSON column, so the field needs no table change): it loads, and the next sweep's time is kept."""
    import sqlalchemy as sa

    from lagdoctor.state import incident_threads

    server = slack_connection
    assert post_or_update_incident(provisional(), None, run_id="run-1", now=T0)["decision"] == "posted"
    store = ThreadStore()
    with store.db.transaction() as conn:
        row = conn.execute(sa.select(incident_threads.c.id, incident_threads.c.data)).one()
        old = {k: v for k, v in row.data.items() if k != "decided_by"}
        conn.execute(sa.update(incident_threads).where(incident_threads.c.id == row.id).values(data=old))
    dispose_engines()
    (thread,) = ThreadStore().all()
    assert thread.provisional and thread.decided_by is None
    assert post_or_update_incident(still_provisional("2026-11-21T10:10:00Z"), None, run_id="run-2",
                                   now=T0 + timedelta(minutes=5))["decision"] == "unchanged"
    assert [s.decided_by for s in ThreadStore().all()] == ["2026-11-21T10:10:00Z"]
    assert post_or_update_incident(still_provisional("2026-11-21T10:20:00Z"), None, run_id="run-3",
                                   now=T0 + timedelta(minutes=10))["decision"] == "replied"
    assert "not decided at the first sweep after 10:10 UTC as promised" in texts_in_thread(server, 0)[0]


def test_a_provisional_thread_is_not_closed_by_another_finding_of_the_same_sweep(settings, slack_connection):
    """A sweep may find a rebalance loop beside the imbalance it is still deciding on: the loop gets its
    own thread and the provisional thread stays open, whichever finding is posted first."""
    server = slack_connection
    assert post_or_update_incident(provisional(), None, run_id="run-1", now=T0)["decision"] == "posted"
    loop = finding("rebalance_loop", "warning", partitions=(0, 1), lag=5000, summary="12 rebalances")
    sweep = [loop, provisional()]
    result = post_or_update_incident(loop, None, run_id="run-2", now=T0 + timedelta(minutes=5), sweep=sweep)
    assert result["decision"] == "posted" and result["superseded"] == []
    assert post_or_update_incident(provisional(), None, run_id="run-2", now=T0 + timedelta(minutes=5),
                                   sweep=sweep)["decision"] == "unchanged"
    assert len(server.messages) == 2 and texts_in_thread(server, 0) == []
    assert sorted((s.key.diagnosis, s.provisional) for s in ThreadStore().all() if s.status == "open") == [
        ("partition_imbalance", True), ("rebalance_loop", False)]


def test_the_sweeps_post_task_keeps_a_provisional_thread_another_of_its_findings_lands_in(settings, slack_connection,
                                                                                         tmp_path):
    from lagdoctor.stages.notify import post_findings

    server = slack_connection
    assert post_or_update_incident(provisional(), None, run_id="run-1", now=T0)["decision"] == "posted"
    loop = finding("rebalance_loop", "warning", partitions=(0, 1), lag=5000, summary="12 rebalances")
    plans = tmp_path / "run-2" / "plans.json"
    plans.parent.mkdir()
    plans.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}}
                                 for f in (loop, provisional())]))
    post_findings(str(plans), "run-2", settings=Settings.from_env())
    assert len(server.messages) == 2 and "rebalance_loop" in server.messages[1]["text"]
    assert texts_in_thread(server, 0) == []
    assert sorted(s.key.diagnosis for s in ThreadStore().all() if s.status == "open") == [
        "partition_imbalance", "rebalance_loop"]


def _provisional_state(decided_by="2026-11-21T10:10:00Z"):
    return state_for(provisional(), provisional=True, deciding_between=["partition_imbalance", "stalled_consumer"],
                     decided_by=decided_by)


# (current finding, thread state, now, expected decision, why)
PROMISE_RULES = [
    (still_provisional("2026-11-21T10:20:00Z"), _provisional_state(), T0 + timedelta(minutes=9, seconds=59),
     "nothing", "9: before the promised 10:10"),
    (still_provisional("2026-11-21T10:20:00Z"), _provisional_state(), T0 + timedelta(minutes=10),
     "undecided", "9: at 10:10 and still provisional: say so, with the new time"),
    (still_provisional("2026-11-21T10:09:30Z"), _provisional_state(), T0 + timedelta(minutes=15),
     "nothing", "9: the same promise as said (minute rounded up): said once"),
    (still_provisional("2026-11-21T10:20:00Z"), _provisional_state(None), T0 + timedelta(minutes=15),
     "nothing", "9: a thread stored before decided_by was kept: no promise known to break"),
    (stalled(), _provisional_state(), T0 + timedelta(minutes=15), "decided", "7 before 9: decided late is decided"),
]


@pytest.mark.parametrize("current,state,now,expected,why", PROMISE_RULES, ids=[r[4] for r in PROMISE_RULES])
def test_promise_rules(current, state, now, expected, why):
    assert decide(current, state, run_id="run-2", now=now).kind == expected


def test_superseded_rule_picks_only_provisional_threads_no_finding_of_the_sweep_lands_in():
    from lagdoctor.notify.threads import superseded_threads

    waiting = _provisional_state()
    named = state_for(finding("slow_consumer"))
    crashed = finding("crashed_consumer", "critical")
    assert superseded_threads(crashed, [waiting, named]) == [waiting]
    assert superseded_threads(crashed, [waiting], [crashed, provisional()]) == []
    assert superseded_threads(crashed, [waiting], [crashed, stalled()]) == []
    assert superseded_threads(provisional(), [waiting]) == [], "its own thread"


def young_rise(**kw):
    """Rule case 36: the lag has risen for under 2.5 minutes, the load up: a burst or a surge's start."""
    return finding("producer_surge", "critical", lag=40_000, partitions=(), provisional=True,
                   deciding_between=["producer_surge", "healthy"], decided_by="2026-11-21T10:02:00Z", samples_needed=1,
                   undecided_because="the lag has risen at every snapshot for 1m00s", **kw)


def test_a_young_rise_says_nothing_a_burst_stays_silent_and_a_surge_is_said_once_decided(settings, slack_connection):
    """Threads rule 12 at the one-minute sweep: a burst its consumers absorb sends no message at all; a surge
    opens its thread once decided, as a decided surge (no "still deciding", no "Decided:" reply)."""
    server = slack_connection
    assert post_or_update_incident(young_rise(), None, run_id="run-1", now=T0)["decision"] == "held"
    drained = finding("healthy", "ok", lag=300, partitions=(), summary="consumers keep up")
    assert post_or_update_incident(drained, None, run_id="run-2", now=T0 + timedelta(minutes=1))["decision"] == "healthy"
    assert server.messages == [] and not list(ThreadStore().all())

    assert post_or_update_incident(young_rise(), None, run_id="run-3", now=T0 + timedelta(minutes=9))["decision"] == "held"
    surge = finding("producer_surge", "critical", lag=90_000, partitions=(), provisional=False,
                    summary="produce rate rose 7.5x (40 -> 300 msg/s)")
    result = post_or_update_incident(surge, None, run_id="run-4", now=T0 + timedelta(minutes=10))
    assert result["decision"] == "posted"
    (root,) = server.messages
    assert "still deciding" not in root["text"] and "Decided" not in json.dumps(root)
    assert [s.key.diagnosis for s in ThreadStore().all() if s.status == "open"] == ["producer_surge"]


def test_a_young_rise_neither_replies_in_nor_closes_an_open_thread_of_its_group(settings, slack_connection):
    server = slack_connection
    slow = finding("slow_consumer", "critical", lag=5000, provisional=False)
    assert post_or_update_incident(slow, None, run_id="run-1", now=T0)["decision"] == "posted"
    held = post_or_update_incident(young_rise(), None, run_id="run-2", now=T0 + timedelta(minutes=1), sweep=[young_rise()])
    assert held["decision"] == "held" and len(server.messages) == 1
    (state,) = ThreadStore().all()
    assert state.status == "open" and state.key.diagnosis == "slow_consumer" and state.last_run_id == "run-1"


def test_a_sweep_of_healthy_groups_without_threads_costs_no_transaction_per_group(settings, slack_connection,
                                                                                   tmp_path):
    """Issue 31: at 10,000 groups a transaction (and an outbox delivery) per healthy group was tens of
    thousands of connects a minute. A healthy group with no thread says nothing and costs nothing; one
    with an open thread is still recovered, in that thread."""
    import sqlalchemy as sa

    from lagdoctor.stages.notify import post_findings
    from lagdoctor.state import state_db

    server = slack_connection
    assert post_or_update_incident(finding("crashed_consumer", "critical", group_id="g7"), None, run_id="run-1",
                                   now=T0)["decision"] == "posted"
    healthy = [finding("healthy", "ok", lag=0, partitions=(), group_id=f"g{i}") for i in range(1000)]
    healthy[3]["evidence"] = {"lag_total": 0, "data_complete": False}  # rule 6 without a thread: nothing either
    plans = tmp_path / "run-2" / "plans.json"
    plans.parent.mkdir()
    plans.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}} for f in healthy]))
    engine = state_db(settings).engine
    transactions: list[int] = []

    def count(_conn) -> None:
        transactions.append(1)

    sa.event.listen(engine, "begin", count)
    try:
        summary = post_findings(str(plans), "run-2", settings=settings, now=T0 + timedelta(minutes=5))
    finally:
        sa.event.remove(engine, "begin", count)

    assert summary == {"healthy": 998, "incomplete": 1, "recovered": 1}
    assert len(server.messages) == 2 and "recovered" in texts_in_thread(server, 0)[0].lower()
    assert [s.status for s in ThreadStore().all()] == ["closed"]
    assert len(transactions) < 50, len(transactions)  # a handful for the task, none per healthy group


def test_with_an_object_store_root_the_outbox_is_a_local_file_on_the_worker(tmp_path, monkeypatch):
    """An s3:// data root once made the outbox `s3:/bucket/...` relative to the task's working directory."""
    from lagdoctor.notify.slack import OutboxSender, slack_sender
    from lagdoctor.settings import Settings

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.chdir(tmp_path)
    sender = slack_sender("no_such_slack_connection", settings=Settings(data_root="s3://bucket/lagdoctor"))
    assert isinstance(sender, OutboxSender)
    sender.post(text="hello", blocks=[])
    outbox = tmp_path / "airflow" / "lagdoctor" / "outbox" / "slack.jsonl"
    assert [json.loads(line)["text"] for line in outbox.read_text().splitlines()] == ["hello"]
    assert not (tmp_path / "s3:").exists()
