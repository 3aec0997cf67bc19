"""The record at a group's position, read on the embedded broker (issue 10's record fetch):
its timestamp, key hash, size and header names; never its payload; every position answered."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.kafka.clients import client_config
from lagdoctor.kafka.records import read_records_at
from lagdoctor.lab.workload import create_topic

T0 = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)


@pytest.fixture
def records_topic(kafka_bootstrap, unique):
    """Partition 0: five records one minute apart, keyed, with headers; partition 1: empty."""
    from confluent_kafka import Producer

    topic = unique("records")
    create_topic(kafka_bootstrap, topic, 2, config={"retention.ms": "-1"})  # records stamped at a fixed past time: the broker must not delete them by age
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(topic, partition=0, key=f"order-{i}".encode(), value=b"v" * (100 + i),
                         headers=[("trace-id", b"secret-trace"), ("schema", b"3")],
                         timestamp=int((T0 + timedelta(minutes=i)).timestamp() * 1000))
    assert producer.flush(10) == 0
    return topic


def test_the_record_at_each_position_and_why_the_others_were_not_read(kafka_bootstrap, records_topic):
    topic = records_topic
    found, errors = read_records_at(client_config(kafka_bootstrap),
                                    {(topic, 0): 2, (topic, 1): 0, (topic, 9): 0}, budget_s=5)
    record = found[(topic, 0)]
    assert record.offset == 2 and record.timestamp == T0 + timedelta(minutes=2)
    assert record.timestamp_type == "create_time"
    assert record.key_sha256 == hashlib.sha256(b"order-2").hexdigest()[:16]
    assert record.size == 102 and record.headers == ("trace-id", "schema")
    assert "secret-trace" not in repr(record) and "vvv" not in repr(record)  # names and sizes only
    assert errors[(topic, 1)].startswith("at the end of the log")
    assert (topic, 9) in errors  # no such partition: named, not invented
    assert set(found) | set(errors) == {(topic, 0), (topic, 1), (topic, 9)} and not set(found) & set(errors)


def test_no_position_read_after_the_budget(kafka_bootstrap, records_topic):
    found, errors = read_records_at(client_config(kafka_bootstrap), {(records_topic, 0): 0}, budget_s=0)
    assert found == {} and errors == {(records_topic, 0): "record read budget of 0 s spent"}


def test_a_group_without_a_commit_is_not_read(kafka_bootstrap, records_topic):
    found, errors = read_records_at(client_config(kafka_bootstrap), {(records_topic, 0): None})
    assert found == {} and errors == {(records_topic, 0): "no committed offset"}


def test_assignments_keep_the_most_important_positions_first():
    from lagdoctor.kafka.records import rounds_of

    wanted = [("a", 0, 10), ("a", 0, 20), ("b", 1, 5), ("a", 1, 7), ("a", 0, 10), ("c", 0, 1)]
    rounds = rounds_of(wanted, batch=2)
    # one offset per partition per assignment, at most 2 partitions each, in the order given;
    # the repeated ("a", 0, 10) is read once
    assert rounds == [{("a", 0): 10, ("b", 1): 5}, {("a", 0): 20, ("a", 1): 7}, {("c", 0): 1}]


def test_a_position_retention_removed_after_the_offsets_were_read_is_named(kafka_bootstrap, records_topic):
    """The race the collector's log-start check cannot see: retention passes the committed offset
    between the offsets' read and the record's. librdkafka says _AUTO_OFFSET_RESET there, not the
    broker's OFFSET_OUT_OF_RANGE; either is said in the words a person reads."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.delete_records([TopicPartition(records_topic, 0, 3)]).values():
        fut.result(30)
    found, errors = read_records_at(client_config(kafka_bootstrap), {(records_topic, 0): 1}, budget_s=10)
    assert found == {} and errors == {
        (records_topic, 0): "offset out of range: retention deleted it, or the log restarted"}
