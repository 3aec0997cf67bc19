"""kafka_lag_incident end to end: a live lagging group on the broker, spark-submit local[2],
a loopback Slack server. What the on-call engineer sees is what is asserted."""

from __future__ import annotations

import json
import re
import time

import pytest

from lagdoctor.lab.workload import SteadyProducer, ThrottledConsumer, create_topic

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.airflow]


@pytest.fixture
def lagging_group(kafka_bootstrap, unique):
    """Partition 1's owner processes 30 msg/s while 150 msg/s arrive on each partition."""
    topic, group = unique("payments"), unique("payments-ledger")
    create_topic(kafka_bootstrap, topic, 3)
    producer = SteadyProducer(kafka_bootstrap, topic, [0, 1, 2], rate_per_partition=150).start()
    consumer = ThrottledConsumer(kafka_bootstrap, group, topic, client_id="ledger-1", max_rate={1: 30}).start()
    try:
        assert consumer.assigned.wait(60), "the consumer never joined"
        time.sleep(3)
        yield topic, group
    finally:
        consumer.stop()
        producer.stop()


@pytest.fixture
def airflow_env(monkeypatch, kafka_bootstrap, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    return tmp_path / "data"


def test_incident_run_posts_the_cause_to_slack(airflow_db, incident_dag, airflow_env, lagging_group, slack_connection):
    from airflow.utils.state import DagRunState

    topic, group = lagging_group
    run = incident_dag.test(run_conf={
        "group_pattern": re.escape(group), "dry_run": True, "samples": 6, "interval_seconds": 2, "window_minutes": 30,
    })
    assert run.state == DagRunState.SUCCESS

    findings = [json.loads(l) for p in airflow_env.glob("findings/*/findings.jsonl") for l in p.read_text().splitlines()]
    problems = [f for f in findings if f["group_id"] == group and f["diagnosis"] != "healthy"]
    assert problems, f"no problem found in {findings}"
    # One slow partition owner while the others keep up: an imbalance on partition 1.
    (worst,) = [f for f in problems if f["diagnosis"] == "partition_imbalance"]
    assert worst["partitions"] == [1]
    assert worst["evidence"]["lag_share"] > 0.8

    # One thread for the incident run: a header naming the group, the finding in full inside it.
    header, *replies = slack_connection.posts
    assert group in str(header.body) and "thread_ts" not in header.body
    detail = next(r for r in replies if worst["diagnosis"] in r.body["text"])
    assert detail.body["thread_ts"] == header.ts
    assert group in detail.body["text"]
    assert re.search(r"partition 1\b", detail.body["text"]), "partition 1 is not named"
    assert "PARTITION" in json.dumps(detail.body["blocks"])  # the describe-shaped evidence table
    # A dry run: remediation said what it would do and touched nothing.
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.settings import Settings

    records = list(ActionLog.from_settings(Settings(data_root=str(airflow_env))).records())
    assert all(r["dry_run"] for r in records)
    assert not [r for r in records if r["status"] in ("started", "executed")]
