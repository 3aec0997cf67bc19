"""lagdoctor's state database: where it lives, leases, and check-then-act under races.

Every test that touches the database runs twice, against SQLite and against a
real PostgreSQL server (tests/fixtures/postgres.py).
"""

from __future__ import annotations

import multiprocessing
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from lagdoctor.settings import Settings
from lagdoctor.state import STATE_URL_ENV, StateConfigError, StateDB, leases, state_url

NOW = datetime(2026, 11, 23, 3, 14, tzinfo=timezone.utc)


def test_default_is_sqlite_under_the_data_root(tmp_path):
    url = state_url(Settings(data_root=str(tmp_path)), environ={})
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "state" / "lagdoctor.db")


def test_a_remote_data_root_without_a_state_database_is_refused_in_one_line():
    with pytest.raises(StateConfigError) as err:
        state_url(Settings(data_root="s3a://bucket/lagdoctor"), environ={})
    message = str(err.value)
    assert "\n" not in message
    assert "s3a://" in message and "lagdoctor_state" in message


def test_the_lagdoctor_state_connection_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_LAGDOCTOR_STATE",
                       '{"conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "ld",'
                       ' "password": "s3cr3t-pw", "schema": "lagdoctor"}')
    url = state_url(Settings(data_root=str(tmp_path)), environ={})
    assert (url.drivername, url.host, url.port, url.database, url.username) == (
        "postgresql+psycopg", "db.internal", 5432, "lagdoctor", "ld")


def test_an_unreachable_database_fails_in_one_line_without_its_password():
    url = "postgresql+psycopg://ld:s3cr3t-pw@127.0.0.1:9/lagdoctor?connect_timeout=2"
    with pytest.raises(StateConfigError) as err:
        StateDB.from_url(url)
    assert "s3cr3t-pw" not in str(err.value)
    assert "127.0.0.1:9" in str(err.value) and "\n" not in str(err.value)


def test_state_url_env_wins(tmp_path):
    url = state_url(Settings(data_root="s3a://bucket/x"), environ={STATE_URL_ENV: f"sqlite:///{tmp_path}/s.db"})
    assert url.database == f"{tmp_path}/s.db"


def test_a_lease_is_exclusive_until_it_expires_or_is_released(state_url):
    db = StateDB.from_url(state_url)
    ttl = timedelta(minutes=10)
    assert db.acquire_lease("prod/orders/restart", "run-a", ttl, now=NOW)
    assert not db.acquire_lease("prod/orders/restart", "run-b", ttl, now=NOW + timedelta(minutes=5))
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=5)) == "run-a"
    # the holder renews; another key is independent
    assert db.acquire_lease("prod/orders/restart", "run-a", ttl, now=NOW + timedelta(minutes=6))
    assert db.acquire_lease("prod/payments/restart", "run-b", ttl, now=NOW)
    # expired: taken over
    assert db.acquire_lease("prod/orders/restart", "run-b", ttl, now=NOW + timedelta(minutes=17))
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) == "run-b"
    # only the holder releases
    db.release_lease("prod/orders/restart", "run-a")
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) == "run-b"
    db.release_lease("prod/orders/restart", "run-b")
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) is None


def test_a_failed_transaction_leaves_nothing_behind(state_url):
    db = StateDB.from_url(state_url)
    with pytest.raises(RuntimeError):
        with db.transaction() as conn:
            db.acquire_lease("k", "run-a", timedelta(minutes=1), now=NOW, conn=conn)
            raise RuntimeError("crash between the check and the act")
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(leases)).scalar() == 0


def _race(url: str, holder: str, start, results) -> None:
    from lagdoctor.state import StateDB

    db = StateDB.from_url(url)
    start.wait()
    results.put((holder, db.acquire_lease("prod/orders/restart_consumers", holder, timedelta(minutes=10))))


def test_two_processes_racing_for_one_lease_exactly_one_wins(state_url):
    # No warm-up: the racers also race to create the database and its tables.
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(state_url, f"run-{i}", start, results)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = dict(results.get(timeout=5) for _ in procs)
    assert sum(outcomes.values()) == 1, outcomes
    winner = next(h for h, won in outcomes.items() if won)
    assert StateDB.from_url(state_url).lease_holder("prod/orders/restart_consumers") == winner


# -- retention -----------------------------------------------------------------------

def _record(key, status, ts, *, group="orders", dry_run=False, **extra):
    return {"idempotency_key": key, "run_id": f"run-{key}", "action": "restart_consumers", "cluster": "prod",
            "group_id": group, "topic": "orders", "status": status, "dry_run": dry_run, "ts": ts.isoformat(),
            "target": f"deployment {group}", **extra}


def test_pruning_the_action_log_changes_no_guardrail_verdict_and_keeps_a_key_whole(state_url):
    from lagdoctor.remediation.audit import ActionLog, prune_action_log
    from lagdoctor.remediation.config import RemediationConfig
    from lagdoctor.remediation.guardrails import check_guardrails

    db = StateDB.from_url(state_url)
    audit = ActionLog(db)
    for record in [
        _record("old-executed", "started", NOW - timedelta(days=12)),
        _record("old-executed", "executed", NOW - timedelta(days=12)),
        _record("old-dry-run", "dry_run", NOW - timedelta(days=10), dry_run=True),
        _record("old-failure", "started", NOW - timedelta(days=9)),
        _record("old-failure", "failed", NOW - timedelta(days=9), may_have_changed=True),
        # started 9 days ago, finished yesterday: its key is recent, so all of it stays
        _record("long-running", "started", NOW - timedelta(days=9), group="billing"),
        _record("long-running", "executed", NOW - timedelta(days=1), group="billing"),
        # no outcome yet: counts against the cooldown and the cap
        _record("in-flight", "started", NOW - timedelta(minutes=40), group="payments"),
        _record("recent", "executed", NOW - timedelta(minutes=20), group="search"),
    ]:
        audit.append(record)
    config = RemediationConfig(cooldown_minutes=60, max_actions_per_hour=2)

    def verdicts():
        history = audit.attempts_since(NOW - timedelta(hours=1))
        return {g: check_guardrails(cluster="prod", group_id=g, action="restart_consumers", config=config,
                                    history=history, now=NOW, target=f"deployment {g}")
                for g in ("orders", "billing", "payments", "search")}

    before = verdicts()
    assert (before["payments"].rule, before["search"].rule, before["orders"].rule) == (
        "cooldown", "cooldown", "hourly_cap")
    assert prune_action_log(8, NOW, db=db, window=timedelta(hours=1)) == 5
    assert verdicts() == before
    assert {r["idempotency_key"] for r in audit.records()} == {"long-running", "in-flight", "recent"}
    assert [r["status"] for r in audit.for_key("long-running")] == ["started", "executed"]


def test_a_cooldown_longer_than_retention_keeps_its_records_until_it_ends(state_url, monkeypatch):
    from types import SimpleNamespace

    from lagdoctor.remediation.audit import ActionLog, guardrail_window, prune_action_log
    from lagdoctor.remediation.config import RemediationConfig
    from lagdoctor.remediation.guardrails import check_guardrails

    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", '{"cooldown_minutes": 20160}')  # two weeks
    assert guardrail_window() == timedelta(days=14)
    # A runbook may lengthen a cooldown, and then its window is the longest.
    runbook = SimpleNamespace(actions=[SimpleNamespace(guardrails={"cooldown_minutes": 43200})])
    assert guardrail_window(RemediationConfig(), [runbook]) == timedelta(days=30)

    db = StateDB.from_url(state_url)
    audit = ActionLog(db)
    audit.append(_record("ten-days-ago", "executed", NOW - timedelta(days=10)))
    assert prune_action_log(8, NOW, db=db) == 0
    verdict = check_guardrails(cluster="prod", group_id="orders", action="restart_consumers",
                               config=RemediationConfig.from_env(), now=NOW, target="deployment orders",
                               history=audit.attempts_since(NOW - guardrail_window()))
    assert verdict.rule == "cooldown"
    assert prune_action_log(8, NOW + timedelta(days=5), db=db) == 1  # 15 days old: the cooldown is over


class FlakySlack:
    """A Slack sender that accepts `ok` more posts, then fails (None: always accepts)."""

    kind = "test"

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.ok: int | None = None

    def post(self, *, text, blocks, thread_ts=None, channel=None):
        from lagdoctor.notify.slack import Posted

        if self.ok is not None:
            if self.ok <= 0:
                raise ConnectionError("Slack is unreachable")
            self.ok -= 1
        ts = f"1700000{len(self.posts):03d}.000100"
        self.posts.append({"text": text, "thread_ts": thread_ts, "ts": ts})
        return Posted(channel or "C0LAGDOC", ts)


def _problem(group, severity="warning", lag=1000, diagnosis="slow_consumer"):
    return {"cluster": "prod", "group_id": group, "topic": "t", "partitions": [0], "diagnosis": diagnosis,
            "pattern": "steady_climb", "severity": severity, "summary": f"{group}: lag {lag}",
            "evidence": {"lag_total": lag}, "window_start": "2026-11-01T09:30:00Z",
            "window_end": "2026-11-01T10:00:00Z"}


def test_pruning_slack_state_keeps_undelivered_messages_and_every_open_thread(state_url, tmp_path):
    from types import SimpleNamespace

    from lagdoctor.notify import incidents, outbox
    from lagdoctor.stages.housekeeping import prune_state
    from lagdoctor.state import run_threads, slack_messages

    settings = Settings(data_root=str(tmp_path))
    db = StateDB.from_url(state_url)
    slack = FlakySlack()
    old = NOW - timedelta(days=20)
    healthy = dict(_problem("billing", "ok", 0, "healthy"), pattern="flat")

    # 20 days ago: orders opened an incident (still open); billing opened one and recovered;
    # a manual run looked at search (nothing wrong); a sweep failed (its thread is open).
    incidents.post_or_update_incident(_problem("orders"), run_id="r1", sender=slack, settings=settings, now=old)
    incidents.post_or_update_incident(_problem("billing"), run_id="r1", sender=slack, settings=settings, now=old)
    incidents.post_or_update_incident(healthy, run_id="r2", sender=slack, settings=settings, now=old)
    incidents.post_incident_run([{"finding": dict(healthy, group_id="search"), "plan": None}], run_id="manual-1",
                                scope="prod / search", sender=slack, settings=settings, now=old)
    ti = SimpleNamespace(dag_id="kafka_lag_health_sweep", task_id="diagnose", run_id="scheduled__1")
    incidents.notify_failure({"ti": ti, "run_id": "scheduled__1", "exception": RuntimeError("spark died")},
                             sender=slack, settings=settings, now=old)
    # Then Slack took a first message and failed the reply queued under it, and a notice.
    with db.transaction() as conn:
        first = outbox.queue_message(db, conn, dedupe_key="notice:first", text="first", blocks=[], now=old)
        outbox.queue_message(db, conn, dedupe_key="notice:reply", text="reply", blocks=[], parent_id=first, now=old)
        outbox.queue_message(db, conn, dedupe_key="notice:quarantine", text="quarantined", blocks=[], now=old)
    slack.ok = 1
    outbox.deliver_pending(db, slack, now=old, wait_s=0)
    db.acquire_lease("deployment orders", "a-run-that-died", timedelta(minutes=15), now=old)
    db.acquire_lease("deployment search", "a-live-run", timedelta(minutes=15), now=NOW)
    posted = {p["text"]: p["ts"] for p in slack.posts}
    assert len(outbox.pending_messages(db)) == 2

    counts = prune_state(8, NOW, settings=settings)

    assert counts["incident_threads"] == 1  # billing's, closed 20 days ago
    assert counts["run_threads"] == 1 and counts["leases"] == 1
    assert counts["slack_messages"] == 3  # billing's post and recovery, the manual run's header
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(run_threads)).scalar() == 0
        left = set(conn.execute(sa.select(slack_messages.c.text)).scalars())
    assert {"first", "reply", "quarantined"} <= left
    assert db.lease_holder("deployment search", now=NOW) == "a-live-run"
    # Slack is back: what waited goes out, the reply in its parent's thread.
    slack.ok = None
    outbox.deliver_pending(db, slack, now=NOW, wait_s=0)
    assert outbox.pending_messages(db) == []
    sent = {p["text"]: p["thread_ts"] for p in slack.posts[-2:]}
    assert sent == {"reply": posted["first"], "quarantined": None}
    # The open incident still replies in its 20-day-old thread.
    root_ts = slack.posts[0]["ts"]
    incidents.post_or_update_incident(_problem("orders", "critical", 9000), run_id="r9", sender=slack,
                                      settings=settings, now=NOW)
    assert slack.posts[-1]["thread_ts"] == root_ts
    # And so does the open failure thread.
    incidents.notify_failure({"ti": ti, "run_id": "scheduled__9", "exception": RuntimeError("broker down")},
                             sender=slack, settings=settings, now=NOW)
    failure_root = next(p["ts"] for p in slack.posts if "kafka_lag_health_sweep" in p["text"])
    assert slack.posts[-1]["thread_ts"] == failure_root


def test_insert_ignore_says_whether_it_inserted(state_url):
    # Callers branch on it (a replayed Slack request, a new lease); PostgreSQL once answered False always.
    from lagdoctor.state import slack_requests

    db = StateDB.from_url(state_url)
    with db.transaction() as conn:
        assert db.insert_ignore(conn, slack_requests, {"signature": "a", "received_at": NOW}, ("signature",))
        assert not db.insert_ignore(conn, slack_requests, {"signature": "a", "received_at": NOW}, ("signature",))


@pytest.mark.parametrize("url", [
    # Each would fail later and worse: insert_ignore and FOR UPDATE are SQLite/PostgreSQL only.
    "mysql+pymysql://ld:s3cr3t-pw@db.internal/lagdoctor",
    "mssql+pyodbc://ld:s3cr3t-pw@db.internal/lagdoctor",
    "oracle+oracledb://ld:s3cr3t-pw@db.internal/lagdoctor",
])
def test_an_unsupported_database_is_refused_in_one_line(url, monkeypatch, tmp_path):
    with pytest.raises(StateConfigError) as err:
        StateDB.from_url(url)
    message = str(err.value)
    assert "must be SQLite or PostgreSQL" in message and url.split(":", 1)[0].split("+")[0] in message
    assert "\n" not in message and "s3cr3t-pw" not in message
    # The same through LAGDOCTOR_STATE_URL, as a deployment would set it.
    monkeypatch.setenv(STATE_URL_ENV, url)
    with pytest.raises(StateConfigError, match="must be SQLite or PostgreSQL"):
        StateDB.from_settings(Settings(data_root=str(tmp_path)))


def test_a_lock_held_elsewhere_fails_after_the_lock_timeout_as_unavailable(postgres_url, monkeypatch):
    """Another session holding the lease row (a hung worker): the wait is bounded and
    reads as "unavailable now" (the notify layer spools), never an endless wait."""
    import threading

    import lagdoctor.state as state

    monkeypatch.setattr(state, "PG_LOCK_TIMEOUT_S", 1)
    db = StateDB.from_url(postgres_url)
    db.acquire_lease("slack-outbox", "run-a", timedelta(minutes=5), now=NOW)
    outcome: dict = {}

    def contender():
        try:
            db.acquire_lease("slack-outbox", "run-b", timedelta(minutes=5), now=NOW)
        except Exception as exc:  # noqa: BLE001
            outcome["error"] = exc

    with db.transaction() as holder:
        holder.execute(sa.select(leases).where(leases.c.key == "slack-outbox").with_for_update())
        worker = threading.Thread(target=contender, daemon=True)
        worker.start()
        worker.join(60)  # a safety net against a hang, not the assertion
        assert not worker.is_alive(), "waited for the lock without a timeout"
    assert state.is_unavailable(outcome["error"]) and "lock timeout" in str(outcome["error"])


def test_pruning_drops_restart_counts_seen_before_the_cutoff_only(state_url):
    """The pods' restart counts only grow, one row per traced pod per sweep: retention removes the
    old ones and keeps what a window still counts from."""
    from lagdoctor.state import pod_restarts, prune_notifications
    from lagdoctor.workloads import remember_restarts

    db = StateDB.from_url(state_url)

    def seen(at, restarts):
        workload = {"namespace": "shop", "pod": "orders-7d9f-x2", "pod_uid": "u1", "restarts": restarts}
        finding = {"window_start": (at - timedelta(minutes=10)).isoformat(), "evidence": {"workload": workload}}
        assert remember_restarts([finding], at, db=db) is None
        return workload

    seen(NOW - timedelta(days=20), 1)
    seen(NOW - timedelta(minutes=12), 2)
    assert prune_notifications(db, NOW - timedelta(days=8))["pod_restarts"] == 1
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(pod_restarts)).scalar() == 1
    assert seen(NOW, 5)["restarts_since"]["restarts"] == 2  # the window still counts from the kept one
