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
              "action": "restart_consumers", "status": "dry_run", "dry_run": True,
              "idempotency_key": "k1", "message": "would restart deployment orders-eu"}
    post_action_result(record, settings=settings)
    assert slack_connection.posts[-1].body["thread_ts"] == header.ts
