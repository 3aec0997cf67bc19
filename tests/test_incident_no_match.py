"""An incident whose group_pattern matches no group fails at once, in one line naming
the closest group ids, before any diagnosis; it never posts "No problem found"."""

from __future__ import annotations

import json
import re
import time

import pytest

from lagdoctor.settings import Settings
from lagdoctor.stages.collect import no_match_message, NoGroupMatched, take_snapshots

SEEN = ["orders-processor", "orders-archiver", "billing-orders", "payments-ledger", "mailer", "x", "inventory"]


@pytest.mark.parametrize("pattern, line", [
    ("orders", "group_pattern 'orders' (full match) matched none of 7 groups on kafka_default; closest: "
               "orders-archiver, orders-processor, billing-orders. Did you mean 'orders-.*'?"),
    ("order-processor", "group_pattern 'order-processor' (full match) matched none of 7 groups on kafka_default; "
                        "closest: orders-processor, orders-archiver. Did you mean 'orders-processor'?"),
    ("ledger", "group_pattern 'ledger' (full match) matched none of 7 groups on kafka_default; "
               "closest: payments-ledger, mailer. Did you mean '.*ledger.*'?"),
    (r"orders\-proc", r"group_pattern 'orders\-proc' (full match) matched none of 7 groups on kafka_default; "
                      "closest: orders-processor, orders-archiver"),
    ("zzzz", "group_pattern 'zzzz' (full match) matched none of 7 groups on kafka_default; closest: none alike"),
])
def test_no_match_line_names_the_closest_groups_and_a_pattern_that_would_match(pattern, line):
    assert no_match_message(pattern, "kafka_default", SEEN) == line
    suggestion = re.search(r"Did you mean '(.+)'\?$", line)
    if suggestion:  # the suggestion really matches what it names, in full
        from lagdoctor.kafka.collector import compile_group_pattern

        assert any(compile_group_pattern(suggestion.group(1)).fullmatch(g) for g in SEEN)


def test_a_cluster_without_groups_says_so():
    assert no_match_message(".*", "kafka_eu", []) == (
        "group_pattern '.*' (full match) matched no group on kafka_eu: it has no consumer groups")


@pytest.fixture
def near_misses(kafka_bootstrap, unique):
    """Three groups whose ids contain `base`, none equal to it: what `orders` meets on a real cluster."""
    from lagdoctor.lab.workload import commit_offsets, create_topic, produce_counts

    base, topic = unique("refunds"), unique("refund-events")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 5})
    for group in (f"{base}-processor", f"{base}-archiver", f"billing-{base}"):
        commit_offsets(kafka_bootstrap, group, topic, {0: 2})
    return base, topic


@pytest.mark.broker
def test_a_topic_none_of_the_groups_reads_fails_naming_their_topics(kafka_bootstrap, near_misses, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    base, topic = near_misses
    with pytest.raises(NoGroupMatched) as no_topic:
        take_snapshots("kafka_default", "manual__t", group_pattern=f"{base}-.*", topic="refunds",
                                     samples=3, interval_s=60, settings=Settings(data_root=str(tmp_path)),
                                     require_match=True)
    assert str(no_topic.value) == (f"topic 'refunds': none of the 2 group(s) matching '{base}-.*' on kafka_default "
                                   f"has offsets on it; their topics: {topic}")
    assert not list(tmp_path.glob("snapshots/**/*.parquet"))  # nothing written, nothing slept


@pytest.mark.broker
@pytest.mark.airflow
def test_an_incident_whose_pattern_matches_nothing_fails_in_the_snapshot_with_the_closest_ids(
        airflow_db, incident_dag, kafka_bootstrap, near_misses, slack_connection, tmp_path, monkeypatch):
    from airflow.utils.state import DagRunState, TaskInstanceState

    base, _ = near_misses
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    failures: list[tuple[str, str]] = []
    incident_dag.get_task("snapshot").on_failure_callback = [
        lambda context: failures.append((type(context["exception"]).__name__, str(context["exception"])))]

    started = time.monotonic()
    run = incident_dag.test(run_conf={"group_pattern": base, "samples": 6, "interval_seconds": 5,
                                      "window_minutes": 30, "dry_run": True})

    assert run.state == DagRunState.FAILED
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert tis["snapshot"].state == TaskInstanceState.FAILED and tis["snapshot"].try_number == 1
    ((kind, line),) = failures
    assert kind == "AirflowFailException"
    assert re.fullmatch(
        rf"group_pattern '{base}' \(full match\) matched none of \d+ groups on kafka_default; closest: "
        rf"{base}-archiver, {base}-processor, billing-{base}\. Did you mean '{base}-\.\*'\?", line), line
    # No diagnosis ran, nothing was sampled, and no green "No problem found" reached Slack.
    assert tis["prepare_diagnosis"].state == TaskInstanceState.UPSTREAM_FAILED
    assert tis["diagnose"].state == TaskInstanceState.UPSTREAM_FAILED
    assert tis["post_findings"].state == TaskInstanceState.UPSTREAM_FAILED
    assert not list((tmp_path / "data").glob("findings/*"))
    assert not list((tmp_path / "data").glob("snapshots/**/*.parquet"))
    assert not [m for m in slack_connection.messages if "No problem found" in json.dumps(m)]
    assert time.monotonic() - started < 25  # not six samples five seconds apart, not a retry delay
