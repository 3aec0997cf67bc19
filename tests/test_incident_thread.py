"""A manual incident run keeps everything in one Slack thread, and a retry posts nothing twice
(against SQLite and PostgreSQL: ``state_url``)."""

from __future__ import annotations

import pytest

from lagdoctor.notify.incidents import post_action_result, post_incident_run
from lagdoctor.settings import Settings


def finding(group: str, diagnosis: str, severity: str = "critical", partitions=(1,)):
    return {
        "cluster": "prod", "group_id": group, "topic": "orders", "partitions": list(partitions),
        "diagnosis": diagnosis, "pattern": "steady_climb", "severity": severity,
        "summary": f"{diagnosis} on {group}", "evidence": {"lag": 5000},
        "window_start": "2026-11-21T03:00:00Z", "window_end": "2026-11-21T03:14:00Z",
    }


@pytest.fixture
def settings(tmp_path, state_url):
    return Settings(data_root=str(tmp_path))


def test_one_thread_for_the_run_with_every_problem_inside(slack_connection, settings):
    items = [
        {"finding": finding("orders-eu", "partition_imbalance"), "plan": None},
        {"finding": finding("orders-us", "rebalance_loop", "warning", ()), "plan": None},
        {"finding": finding("orders-ap", "healthy", "ok", ()), "plan": None},
    ]
    result = post_incident_run(items, run_id="manual__1", scope="prod / orders-.*", settings=settings)
    header, *replies = slack_connection.posts
    assert "thread_ts" not in header.body
    assert "orders-eu" in str(header.body) and "orders-us" in str(header.body)
    assert "2 problem(s), 1 healthy" in header.body["text"]
    assert [r.body["thread_ts"] for r in replies] == [header.ts, header.ts]
    assert [r.body["text"].split(":")[1].split()[0] for r in replies] == ["partition_imbalance", "rebalance_loop"]
    assert result["thread_ts"] == header.ts


def test_a_retried_task_posts_nothing_twice(slack_connection, settings):
    items = [{"finding": finding("orders-eu", "stalled_consumer"), "plan": None}]
    post_incident_run(items, run_id="manual__2", scope="prod", settings=settings)
    post_incident_run(items, run_id="manual__2", scope="prod", settings=settings)
    assert len(slack_connection.posts) == 2  # header + one finding


def test_action_results_land_in_the_run_thread(slack_connection, settings):
    f = finding("orders-eu", "crashed_consumer")
    post_incident_run([{"finding": f, "plan": None}], run_id="manual__3", scope="prod", settings=settings)
    header = slack_connection.posts[0]
    record = {"cluster": "prod", "group_id": "orders-eu", "topic": "orders", "diagnosis": "crashed_consumer",
              "action": "restart_consumers", "status": "dry_run", "dry_run": True, "run_id": "manual__3",
              "idempotency_key": "k1", "message": "would restart deployment orders-eu"}
    post_action_result(record, settings=settings)
    assert slack_connection.posts[-1].body["thread_ts"] == header.ts
    assert post_action_result(record, settings=settings)["decision"] == "unchanged"  # a retried task
    assert len(slack_connection.posts) == 3


def test_sweeps_and_an_incident_run_keep_their_own_threads(slack_connection, settings):
    """Seen live: a sweep's `skip_poison_pill dry run` reply landed in an incident run's thread right
    after that run's `blocked` line. The sweep's incident thread stays the sweep's; the run's, the run's."""
    from datetime import datetime, timedelta, timezone

    from lagdoctor.notify.incidents import post_or_update_incident

    t0 = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)
    stalled = finding("payments-ledger", "stalled_consumer", partitions=(0,))

    def record(run_id, status, message):
        return {"cluster": "prod", "group_id": "payments-ledger", "topic": "orders", "diagnosis": "stalled_consumer",
                "action": "skip_poison_pill", "status": status, "run_id": run_id, "idempotency_key": run_id,
                "dry_run": status == "dry_run", "message": message}

    post_or_update_incident(stalled, run_id="scheduled__1", settings=settings, now=t0)
    sweep_root = slack_connection.posts[0]
    post_incident_run([{"finding": stalled, "plan": None}], run_id="manual__9", scope="prod", settings=settings,
                      now=t0 + timedelta(minutes=1))
    run_root = slack_connection.posts[1]
    post_action_result(record("manual__9", "blocked", "group is STABLE with 1 member(s), not EMPTY"),
                       settings=settings, now=t0 + timedelta(minutes=1))
    assert slack_connection.posts[-1].body["thread_ts"] == run_root.ts

    # the next sweeps: a material change and the sweep's own dry run go to the sweep's thread
    post_or_update_incident({**stalled, "partitions": [0, 2]}, run_id="scheduled__2", settings=settings,
                            now=t0 + timedelta(minutes=2))
    post_action_result(record("scheduled__2", "dry_run", "would copy the record at orders p0@120 to orders.dlq"),
                       settings=settings, now=t0 + timedelta(minutes=2))
    replies = [p for p in slack_connection.posts if p.body.get("thread_ts")]
    in_run = [p for p in replies if p.body["thread_ts"] == run_root.ts]
    in_sweep = [p for p in replies if p.body["thread_ts"] == sweep_root.ts]
    assert len(in_sweep) == 2 and "dry run" in in_sweep[-1].body["blocks"][0]["text"]["text"]
    assert [p.body["text"] for p in in_run][-1].startswith("skip_poison_pill")
    assert len(in_run) == 2  # the run's finding and its own blocked result, nothing of the sweep's
