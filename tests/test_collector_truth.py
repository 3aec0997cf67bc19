"""What the collector tells about group identity, compacted topics, authorization and
non-consumer groups, checked live against Apache Kafka 4.4 (KRaft) with confluent-kafka."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timezone

import pytest
from confluent_kafka import Consumer

from lagdoctor.kafka.clients import admin_client
from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.lab.workload import commit_offsets, create_topic, live_consumer_config, produce_counts

broker = pytest.mark.broker

NOW = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)


class Polling:
    """A consumer polled on a thread until stopped (or paused: it then stops acking rebalances)."""

    def __init__(self, config: dict, topic: str) -> None:
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic])
        self.assigned = threading.Event()
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.paused.is_set():
                time.sleep(0.1)
                continue
            self.consumer.poll(0.2)
            if self.consumer.assignment():
                self.assigned.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def snapshot(bootstrap: str, group: str, **kwargs):
    return collect_snapshot(admin_client(bootstrap), "local", re.escape(group), NOW, bootstrap=bootstrap,
                            **kwargs).to_pylist()


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


# -- 1. member identity ----------------------------------------------------------------


@broker
@pytest.mark.parametrize("protocol, expected_type", [("classic", "classic"), ("consumer", "consumer")])
def test_group_type_and_static_member_id_are_on_the_rows(kafka_bootstrap, unique, protocol, expected_type):
    topic, group = unique("ident"), unique(f"ident-{protocol}")
    create_topic(kafka_bootstrap, topic, 2)
    produce_counts(kafka_bootstrap, topic, {0: 3, 1: 3})
    extra = {"group.protocol": protocol, "group.instance.id": "pod-7"}
    if protocol == "consumer":
        extra["session.timeout.ms"] = None  # a KIP-848 client refuses it: the broker owns the timeout
    config = {k: v for k, v in live_consumer_config(kafka_bootstrap, group, "worker-7", **extra).items()
              if v is not None}
    member = Polling(config, topic)
    try:
        assert member.assigned.wait(30), "the consumer was never assigned its partitions"
        rows = wait_for(lambda: [r for r in snapshot(kafka_bootstrap, group) if r["group_state"] == "STABLE"],
                        what="a STABLE group")
    finally:
        member.close()
    assert {(r["partition"], r["group_type"], r["group_instance_id"], r["client_id"]) for r in rows} == {
        (0, expected_type, "pod-7", "worker-7"), (1, expected_type, "pod-7", "worker-7")}


@broker
def test_a_group_without_members_has_no_instance_id(kafka_bootstrap, unique):
    topic, group = unique("plain"), unique("committed-only")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 4})
    commit_offsets(kafka_bootstrap, group, topic, {0: 1})
    (row,) = snapshot(kafka_bootstrap, group)
    assert row["group_state"] == "EMPTY" and row["group_instance_id"] is None
    # Kafka 4.4 keeps a group that only ever committed as a classic group.
    assert row["group_type"] == "classic"


@broker
def test_kip848_group_mid_rebalance_is_reconciling_not_unknown(kafka_bootstrap, unique):
    """confluent-kafka 2.16 reports a KIP-848 group's Reconciling state as UNKNOWN; a member
    that does not hold its target assignment tells the collector the group is mid-rebalance."""
    from confluent_kafka import ConsumerGroupState

    topic, group = unique("recon"), unique("recon-group")
    create_topic(kafka_bootstrap, topic, 4)
    config = {k: v for k, v in live_consumer_config(kafka_bootstrap, group, "first",
                                                    **{"group.protocol": "consumer"}).items()
              if k != "session.timeout.ms"}
    first = Polling(config, topic)
    second = None
    try:
        assert first.assigned.wait(30)
        wait_for(lambda: {r["group_state"] for r in snapshot(kafka_bootstrap, group, record_partitions=0)}
                 == {"STABLE"} or None, what="a STABLE group")
        # The first member stops polling: it never gives up the partitions the second one is to get.
        first.paused.set()
        second = Polling({**config, "client.id": "second"}, topic)
        admin = admin_client(kafka_bootstrap)
        raw = wait_for(lambda: (lambda d: d if len(d.members) == 2 else None)(
            admin.describe_consumer_groups([group], request_timeout=10)[group].result()), what="two members")
        rows = snapshot(kafka_bootstrap, group, record_partitions=0)
    finally:
        first.close()
        if second is not None:
            second.close()
    assert raw.state == ConsumerGroupState.UNKNOWN  # what the client says: no name for Reconciling
    assert {r["group_state"] for r in rows} == {"RECONCILING"}
    assert {r["group_type"] for r in rows} == {"consumer"}
    assert {r["group_members"] for r in rows} == {2}


# -- 2. compacted topics ---------------------------------------------------------------


@broker
def test_cleanup_policy_is_read_with_retention(kafka_bootstrap, unique):
    from confluent_kafka.admin import NewTopic

    compacted, both, group = unique("changelog"), unique("both"), unique("compact-reader")
    admin = admin_client(kafka_bootstrap)
    for fut in admin.create_topics([NewTopic(compacted, 1, 1, config={"cleanup.policy": "compact"}),
                                    NewTopic(both, 1, 1, config={"cleanup.policy": "delete,compact"})]).values():
        fut.result()
    for topic in (compacted, both):
        produce_counts(kafka_bootstrap, topic, {0: 3})
        commit_offsets(kafka_bootstrap, group, topic, {0: 1})
    rows = {r["topic"]: r for r in snapshot(kafka_bootstrap, group)}
    assert rows[compacted]["cleanup_policy"] == "compact"
    assert rows[both]["cleanup_policy"] == "compact,delete"  # one spelling, whatever order the topic has
    assert rows[compacted]["retention_ms"] == 604_800_000  # still listed: the forecast must know to ignore it
