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

    def __init__(self, config: dict, topic: str | list[str]) -> None:
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic] if isinstance(topic, str) else topic)
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
        # Until the coordinator has computed the new target nothing diverges yet: ASSIGNING comes first.
        rows = wait_for(lambda: (lambda rs: rs if {r["group_state"] for r in rs} == {"RECONCILING"} else None)(
            snapshot(kafka_bootstrap, group, record_partitions=0)), what="RECONCILING")
        raw = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
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


# -- 3. authorization ------------------------------------------------------------------

PASSWORDS = {"admin": "adm-Pw-41c7", "alice": "alice-Pw-93e1", "bob": "bob-Pw-5d20"}


@pytest.fixture(scope="module")
def sasl():
    """A SASL/PLAIN listener with ACLs: alice may describe her group and one topic, bob also the cluster."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic, ResourcePatternType,
                                       ResourceType)

    from lagdoctor.kafka.broker import EmbeddedBroker

    with EmbeddedBroker(sasl_users=PASSWORDS, heap="512m") as kafka:
        admin = admin_client(kafka.bootstrap, kafka.client_config("admin"))
        for fut in admin.create_topics([NewTopic("open", 2, 1), NewTopic("secret", 2, 1)]).values():
            fut.result()

        def allow(user, kind, name, op):
            return AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op,
                              AclPermissionType.ALLOW)

        acls = [allow(user, kind, name, AclOperation.DESCRIBE) for user in ("alice", "bob")
                for kind, name in ((ResourceType.GROUP, "mine"), (ResourceType.TOPIC, "open"))]
        acls.append(allow("bob", ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE))
        for fut in admin.create_acls(acls).values():
            fut.result()
        yield kafka


def as_user(kafka, user, pattern, **kwargs):
    config = kafka.client_config(user)
    return collect_snapshot(admin_client(kafka.bootstrap, config), "secure", pattern, NOW,
                            bootstrap=kafka.bootstrap, **kwargs).to_pylist()


@broker
def test_a_listed_group_the_principal_may_not_describe_keeps_a_row_saying_so(sasl, caplog):
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition

    admin = admin_client(sasl.bootstrap, sasl.client_config("admin"))
    producer = Producer(sasl.client_config("admin"))
    for i in range(10):
        producer.produce("open", b"x", partition=i % 2)
    assert producer.flush(10) == 0
    for group in ("mine", "theirs"):
        # A fresh cluster answers NOT_COORDINATOR per partition until __consumer_offsets is up.
        wait_for(lambda g=group: all(tp.error is None for tp in admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, [TopicPartition("open", 0, 2), TopicPartition("open", 1, 3)])]
        )[g].result().topic_partitions), what=f"a commit for {group}")
    # bob may describe the cluster: Kafka lists every group to him, then refuses the reads of "theirs".
    with caplog.at_level("DEBUG"):
        rows = as_user(sasl, "bob", "mine|theirs")
    by = {(r["group_id"], r["topic"], r["partition"]): r for r in rows}
    assert {k[0] for k in by} == {"mine", "theirs"}
    theirs = by[("theirs", "", -1)]
    assert theirs["group_state"] == "UNKNOWN" and theirs["committed_offset"] is None and theirs["lag"] is None
    assert theirs["read_error"] == (
        "group description: Broker: Group authorization failed (GROUP_AUTHORIZATION_FAILED); "
        "committed offsets: LISTCONSUMERGROUPOFFSETS worker coordinator request failed: "
        "Broker: Group authorization failed (GROUP_AUTHORIZATION_FAILED)")
    assert by[("mine", "open", 0)]["read_error"] is None and by[("mine", "open", 1)]["lag"] == 2
    assert not any(secret in caplog.text + repr(rows) for secret in PASSWORDS.values())
    # alice may not describe the cluster: Kafka's ListGroups hides "theirs" from her altogether.
    assert {r["group_id"] for r in as_user(sasl, "alice", "mine|theirs")} == {"mine"}


@broker
def test_a_topic_the_principal_may_not_describe_keeps_its_rows_saying_so(sasl):
    group = "mine"
    config = {**sasl.client_config("admin"), "group.id": group, "client.id": "owner",
              "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 6000}
    member = Polling(config, ["open", "secret"])
    try:
        assert member.assigned.wait(30)
        rows = wait_for(lambda: (lambda rs: rs if {r["group_state"] for r in rs} == {"STABLE"}
                                 and any(r["topic"] == "secret" for r in rs) else None)(
            as_user(sasl, "alice", group, record_partitions=0)), what="a STABLE group owning secret")
    finally:
        member.close()
    secret = sorted((r for r in rows if r["topic"] == "secret"), key=lambda r: r["partition"])
    assert [r["partition"] for r in secret] == [0, 1]
    for r in secret:
        # Kafka's OffsetFetch leaves the topic out; the member's assignment names it: unknown, never lag 0.
        assert r["lag"] is None and r["committed_offset"] is None and r["log_end_offset"] is None
        assert r["read_error"].startswith("topic metadata: ") and "TOPIC_AUTHORIZATION_FAILED" in r["read_error"]
        assert r["member_id"] is not None and r["client_id"] == "owner"
    assert {r["read_error"] for r in rows if r["topic"] == "open"} == {None}


@broker
def test_a_topic_the_principal_may_not_read_falls_back_to_the_estimate_said_once(sasl, unique, caplog):
    # klag-exporter's users saw record reads fail on a missing READ right; the snapshot must
    # still complete, every offset read, the time lag falling back to the estimate with the reason.
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic, ResourcePatternType,
                                       ResourceType)

    unread, readable, first, second = unique("unread"), unique("readable"), unique("audit-a"), unique("audit-b")
    admin = admin_client(sasl.bootstrap, sasl.client_config("admin"))
    for fut in admin.create_topics([NewTopic(unread, 3, 1), NewTopic(readable, 1, 1)]).values():
        fut.result()

    def allow(kind, name, op):
        return AclBinding(kind, name, ResourcePatternType.LITERAL, "User:alice", "*", op, AclPermissionType.ALLOW)

    # alice may describe both groups and both topics, and READ only `readable`
    acls = [allow(ResourceType.GROUP, g, AclOperation.DESCRIBE) for g in (first, second)]
    acls += [allow(ResourceType.TOPIC, t, AclOperation.DESCRIBE) for t in (unread, readable)]
    acls.append(allow(ResourceType.TOPIC, readable, AclOperation.READ))
    for fut in admin.create_acls(acls).values():
        fut.result()
    producer = Producer(sasl.client_config("admin"))
    for i in range(10):
        for p in range(3):
            producer.produce(unread, b"x", partition=p)
        producer.produce(readable, b"y", partition=0)
    assert producer.flush(10) == 0
    # two groups at different offsets of unread[0]: two fetch rounds, the topic is tried once
    commits = {first: [TopicPartition(unread, 0, 1), TopicPartition(unread, 1, 2), TopicPartition(unread, 2, 3),
                       TopicPartition(readable, 0, 4)],
               second: [TopicPartition(unread, 0, 5)]}
    for group, offsets in commits.items():
        wait_for(lambda g=group, o=offsets: all(tp.error is None for tp in admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, o)])[g].result().topic_partitions), what=f"a commit for {group}")

    with caplog.at_level("WARNING"):
        rows = as_user(sasl, "alice", f"{first}|{second}")
    committed = [r for r in rows if r["committed_offset"] is not None]
    assert len(committed) == 5
    assert all(r["read_error"] is None and r["lag"] == 10 - r["committed_offset"] for r in committed)
    denied = [r for r in committed if r["topic"] == unread]
    assert len(denied) == 4 and {r["committed_record_ts"] for r in denied} == {None}
    assert {r["committed_record_error"] for r in denied} == {f"no READ permission on topic {unread}"}
    (kept,) = [r for r in committed if r["topic"] == readable]
    assert kept["committed_record_offset"] == 4 and kept["committed_record_ts"] is not None
    said = [r.getMessage() for r in caplog.records if r.name == "lagdoctor.kafka.records"]
    assert len(said) == 1 and unread in said[0]  # once per topic, not per partition or round


@broker
def test_a_failed_group_listing_is_a_row_saying_groups_may_be_missing(kafka_bootstrap, unique):
    from confluent_kafka import KafkaError

    from lagdoctor.contracts import GROUP_ROW_PARTITION, GROUP_ROW_TOPIC, LISTING_ROW_GROUP
    from tests.fixtures.failing_admin import FailingAdmin

    topic, group = unique("listed"), unique("listed-group")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 3})
    commit_offsets(kafka_bootstrap, group, topic, {0: 1})
    admin = FailingAdmin(admin_client(kafka_bootstrap), listing_errors=[KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
    rows = collect_snapshot(admin, "local", re.escape(group), NOW).to_pylist()
    by = {(r["group_id"], r["topic"], r["partition"]): r for r in rows}
    assert set(by) == {(group, topic, 0), (LISTING_ROW_GROUP, GROUP_ROW_TOPIC, GROUP_ROW_PARTITION)}
    listing = by[(LISTING_ROW_GROUP, GROUP_ROW_TOPIC, GROUP_ROW_PARTITION)]
    assert listing["read_error"] == "group listing: Broker: Coordinator load in progress (COORDINATOR_LOAD_IN_PROGRESS)"
    assert listing["group_state"] == "UNKNOWN" and listing["lag"] is None and listing["group_members"] is None
    assert by[(group, topic, 0)]["lag"] == 2 and by[(group, topic, 0)]["read_error"] is None


# -- 4. share and streams groups -------------------------------------------------------


@broker
def test_share_groups_are_counted_once_as_not_diagnosed(kafka_bootstrap, unique, caplog):
    from confluent_kafka import ShareConsumer

    from lagdoctor.kafka.collector import undiagnosed_groups

    topic, share, plain = unique("queue"), unique("share-workers"), unique("plain-readers")
    create_topic(kafka_bootstrap, topic, 2)
    commit_offsets(kafka_bootstrap, plain, topic, {0: 0, 1: 0})
    worker = ShareConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": share, "log_level": 0})
    worker.subscribe([topic])
    pattern = f"{re.escape(share)}|{re.escape(plain)}"
    admin = admin_client(kafka_bootstrap)
    try:
        # A share group starts at the log end (share.auto.offset.reset latest): produce once it has joined.
        deadline, got = time.monotonic() + 40, 0
        while not got and time.monotonic() < deadline:
            produce_counts(kafka_bootstrap, topic, {0: 1, 1: 1})
            got = sum(1 for m in worker.poll(1.0) if not m.error())
        assert got, "the share consumer never received a record"
        with caplog.at_level("INFO", logger="lagdoctor.kafka.collector"):
            tables = [collect_snapshot(admin, "local", pattern, NOW) for _ in range(2)]
    finally:
        worker.close()
    for table in tables:
        assert {r["group_id"] for r in table.to_pylist()} == {plain}  # no row, no read_error for the share group
        assert {r["read_error"] for r in table.to_pylist()} == {None}
        assert undiagnosed_groups(table) == [share]
    said = [r.getMessage() for r in caplog.records if share in r.getMessage()]
    assert said == [f"group {share} is not a consumer group (a share or streams group): not diagnosed"]
