"""The snapshot carries the record at the committed offset of each (group, topic)'s most
lagging partitions (issue 10): its timestamp for the exact time lag, and what it looks like
(key hash, size, header names) for a stuck partition; never its payload, never a read_error."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.kafka.clients import admin_client
from lagdoctor.lab.workload import commit_offsets, create_topic, produce_counts

broker = pytest.mark.broker

NOW = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)
T0 = NOW - timedelta(hours=2)


@pytest.fixture(scope="module")
def stamped_topic(kafka_bootstrap):
    """4 partitions of 10 records each; record j of every partition was produced at T0 + j minutes."""
    import uuid

    from confluent_kafka import Producer

    topic = f"payments-{uuid.uuid4().hex[:6]}"
    create_topic(kafka_bootstrap, topic, 4, config={"retention.ms": "-1"})  # records stamped at a fixed past time: the broker must not delete them by age
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    for p in range(4):
        for j in range(10):
            producer.produce(topic, partition=p, key=f"card-{p}-{j}".encode(), value=b"x" * (50 + j),
                             headers=[("traceparent", b"00-secret"), ("retry", b"1")],
                             timestamp=int((T0 + timedelta(minutes=j)).timestamp() * 1000))
            producer.flush(10)
    return topic


def rows(table, group):
    return {r["partition"]: r for r in table.to_pylist() if r["group_id"] == group}


@broker
def test_the_most_lagging_partitions_carry_their_committed_record(kafka_bootstrap, stamped_topic, unique):
    topic = stamped_topic
    a, b = unique("ledger"), unique("audit")
    commit_offsets(kafka_bootstrap, a, topic, {0: 2, 1: 5, 2: 9, 3: 10})  # lags 8, 5, 1, 0
    commit_offsets(kafka_bootstrap, b, topic, {0: 4})  # shares partition 0 at another offset: a second round
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", f"{a}|{b}", NOW, bootstrap=kafka_bootstrap,
                             record_partitions=2)
    ra, rb = rows(table, a), rows(table, b)

    assert ra[0]["committed_record_ts"] == T0 + timedelta(minutes=2)
    assert ra[1]["committed_record_ts"] == T0 + timedelta(minutes=5)
    assert rb[0]["committed_record_ts"] == T0 + timedelta(minutes=4)
    r = ra[0]
    assert r["committed_record_offset"] == 2 and r["committed_record_size"] == 52
    assert r["committed_record_key_sha256"] == hashlib.sha256(b"card-0-2").hexdigest()[:16]
    assert r["committed_record_headers"] == "traceparent,retry"
    assert "secret" not in repr(table.to_pylist())  # header values and payloads are never kept
    # only the 2 most lagging partitions are read; a caught-up one has nothing to read
    assert ra[2]["committed_record_ts"] is None and ra[2]["committed_record_error"] is None
    assert ra[3]["committed_record_ts"] is None and ra[3]["committed_record_error"] is None
    assert all(row["read_error"] is None for row in table.to_pylist())


@broker
def test_a_record_that_cannot_be_read_is_named_and_the_offsets_stand(kafka_bootstrap, stamped_topic, unique):
    group = unique("ledger")
    commit_offsets(kafka_bootstrap, group, stamped_topic, {0: 3})
    # the records' consumer cannot reach any broker: the offsets came from the admin client
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", group, NOW, bootstrap=kafka_bootstrap,
                             consumer_config={"bootstrap.servers": "127.0.0.1:1"}, record_budget_s=1)
    row = rows(table, group)[0]
    assert (row["committed_offset"], row["lag"]) == (3, 7)
    assert row["read_error"] is None  # the offsets are known: the data is complete
    assert row["committed_record_ts"] is None
    assert row["committed_record_error"] == "record read budget of 1 s spent"


@broker
def test_record_partitions_zero_reads_no_record(kafka_bootstrap, stamped_topic, unique):
    group = unique("ledger")
    commit_offsets(kafka_bootstrap, group, stamped_topic, {0: 3})
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", group, NOW, bootstrap=kafka_bootstrap,
                             record_partitions=0)
    row = rows(table, group)[0]
    assert row["committed_record_ts"] is None and row["committed_record_error"] is None


@broker
def test_each_row_carries_its_topics_retention(kafka_bootstrap, unique):
    from confluent_kafka.admin import NewTopic

    admin = admin_client(kafka_bootstrap)
    kept, plain, group = unique("audit-log"), unique("clicks"), unique("auditor")
    fs = admin.create_topics([NewTopic(kept, 1, 1, config={"retention.ms": "3600000", "retention.bytes": "-1"})])
    fs[kept].result(10)
    create_topic(kafka_bootstrap, plain, 1)
    commit_offsets(kafka_bootstrap, group, kept, {0: 0})
    commit_offsets(kafka_bootstrap, group, plain, {0: 0})
    by_topic = {r["topic"]: r for r in collect_snapshot(admin, "local", group, NOW, bootstrap=kafka_bootstrap)
                .to_pylist()}
    assert (by_topic[kept]["retention_ms"], by_topic[kept]["retention_bytes"]) == (3_600_000, -1)
    # a topic created without one has the broker's default, which DescribeConfigs lists (7 days
    # unless the cluster changed log.retention.*)
    assert by_topic[plain]["retention_ms"] not in (None, 0) and by_topic[plain]["retention_bytes"] is not None


def commit_many(bootstrap, offsets_by_group, topic):
    """Commit {group: offset} on partition 0 of `topic`, all groups at once (AdminClient)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = admin_client(bootstrap)
    futures = [admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(g, [TopicPartition(topic, 0, o)])])
               for g, o in offsets_by_group.items()]
    for fs in futures:
        for fut in fs.values():
            assert all(tp.error is None for tp in fut.result(30).topic_partitions)


@broker
@pytest.mark.timeout(120)  # a record read that waited past its budget would hang here, not pass
def test_one_record_budget_covers_every_group_of_the_snapshot(kafka_bootstrap, unique):
    # 600 groups at 600 offsets of one partition: one fetch round each, about 5 s of rounds
    # (8 ms each on the embedded broker) against a 1 s budget, which runs out part way.
    topic, prefix = unique("ledger"), unique("reader")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 650})
    commit_offsets(kafka_bootstrap, f"{prefix}-warm", topic, {0: 649})  # the coordinator is loaded
    commit_many(kafka_bootstrap, {f"{prefix}-{i:03d}": i for i in range(600)}, topic)

    table = collect_snapshot(admin_client(kafka_bootstrap), "local", f"{prefix}-[0-9]+", NOW,
                             bootstrap=kafka_bootstrap, record_partitions=1, record_budget_s=1)
    rows = table.to_pylist()
    assert len(rows) == 600
    # every offset stands: only the record's time is missing, and each row says why
    assert all(r["read_error"] is None and r["lag"] == 650 - r["committed_offset"] for r in rows)
    read = [r for r in rows if r["committed_record_ts"] is not None]
    fell_back = [r for r in rows if r["committed_record_ts"] is None]
    assert read and fell_back and len(read) + len(fell_back) == 600
    assert {r["committed_record_error"] for r in fell_back} == {"record read budget of 1 s spent"}
    # the budget goes to the most lagging first: whatever fell back lags less than whatever was read
    assert max(r["lag"] for r in fell_back) < min(r["lag"] for r in read)


@broker
def test_a_commit_below_the_log_start_is_not_fetched_and_says_why(kafka_bootstrap, unique):
    from confluent_kafka import TopicPartition

    topic, group = unique("refunds"), unique("refunder")
    create_topic(kafka_bootstrap, topic, 2, config={"retention.ms": "-1"})
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 10})
    # retention removes offsets 0..5 of partition 0 (as time or size retention would)
    admin = admin_client(kafka_bootstrap)  # kept: a destroyed client never answers its futures
    for fut in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        fut.result(30)
    commit_offsets(kafka_bootstrap, group, topic, {0: 2, 1: 3})  # lags 8 and 7

    table = collect_snapshot(admin, "local", group, NOW, bootstrap=kafka_bootstrap, record_partitions=1)
    gone, kept = rows(table, group)[0], rows(table, group)[1]
    assert (gone["log_start_offset"], gone["committed_offset"], gone["lag"]) == (6, 2, 8)
    assert gone["read_error"] is None
    assert gone["committed_record_ts"] is None and gone["committed_record_offset"] is None
    assert gone["committed_record_error"] == "committed offset below the log start (retention removed the records)"
    # passed over, it does not take the (group, topic)'s one read: the next most lagging is read
    assert kept["committed_record_offset"] == 3 and kept["committed_record_ts"] is not None
