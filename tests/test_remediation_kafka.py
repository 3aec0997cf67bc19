"""Kafka-side actions against a real broker (the embedded Apache Kafka, or KAFKA_BOOTSTRAP_SERVERS),
with the action log on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from lagdoctor.remediation import RemediationFailed, run_action
from lagdoctor.settings import Settings

pytestmark = pytest.mark.broker
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("LAGDOCTOR_REMEDIATION_CONFIG", raising=False)
    return Settings.from_env()


@pytest.fixture
def kafka_cluster(kafka_bootstrap, monkeypatch):
    """The cluster as an Airflow ``kafka`` connection (contract 5): actions resolve it themselves."""
    conn = {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_TEST", json.dumps(conn))
    return "kafka_test"


def admin(bootstrap):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topics(bootstrap, *topics, partitions=2):
    from confluent_kafka.admin import NewTopic

    with admin(bootstrap) as a:
        for fut in a.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
            fut.result(timeout=30)


def produce(bootstrap, topic, values, partition=0):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        for v in values:
            p.produce(topic, key=b"k", value=v, partition=partition)
        assert p.flush(30) == 0
    finally:
        p.flush(5)


def commit(bootstrap, group, topic, partition, offset):
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    with admin(bootstrap) as a:
        req = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, partition, offset)])]
        for fut in a.alter_consumer_group_offsets(req).values():
            fut.result(timeout=30)


def committed(bootstrap, group, topic, partition):
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    with admin(bootstrap) as a:
        req = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, partition)])]
        (res,) = [f.result(timeout=30) for f in a.list_consumer_group_offsets(req).values()]
    return res.topic_partitions[0].offset


def read_all(bootstrap, topic, isolation="read_committed"):
    """Partition 0's records as a dead-letter reader sees them: read_committed, as the README asks."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-" + topic, "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": isolation})
    out = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while True:
            m = c.poll(10)
            if m is None or (m.error() and m.error().code() == m.error()._PARTITION_EOF):
                return out
            if not m.error():
                out.append(m)
    finally:
        c.close()


def stalled(cluster, group, topic, offset):
    return {"cluster": cluster, "group_id": group, "topic": topic, "partitions": [0],
            "diagnosis": "stalled_consumer", "pattern": "plateau", "severity": "critical",
            "summary": "offset stuck", "evidence": {"partitions": [{"partition": 0, "committed_offset": offset}]},
            "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}


def test_skip_poison_pill_copies_the_record_and_commits_past_it(settings, kafka_bootstrap, kafka_cluster, unique):
    topic, group = unique("orders"), unique("orders-group")
    create_topics(kafka_bootstrap, topic)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(8)])
    commit(kafka_bootstrap, group, topic, 0, 4)  # the group is stuck at offset 4, with no live member
    f = stalled(kafka_cluster, group, topic, 4)

    dry = run_action("skip_poison_pill", f, run_id="r1", now=T0)
    assert dry["status"] == "dry_run" and "p0@4" in dry["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 4
    # with the record the collector read at the stuck offset, the plan says what would move
    seen = {**f, "evidence": {**f["evidence"], "partition": 0, "committed_record": {
        "offset": 4, "timestamp": "2026-11-21T09:14:00.000Z", "key_sha256": "3fa9c2d1e0b4a7f6", "size": 2,
        "headers": ["retry"], "error": None}}}
    shown = run_action("skip_poison_pill", seen, run_id="r0", now=T0)
    assert shown["message"].endswith(
        "; the record: p0@4: key #3fa9c2d1e0b4a7f6, 2 bytes, headers retry, produced 2026-11-21T09:14:00.000Z")
    moved = {**seen, "evidence": {**seen["evidence"], "committed_record": {**seen["evidence"]["committed_record"],
                                                                           "offset": 3}}}
    assert "the record:" not in run_action("skip_poison_pill", moved, run_id="r9", now=T0)["message"]

    waiting = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, now=T0)
    assert waiting["status"] == "awaiting_approval"
    assert committed(kafka_bootstrap, group, topic, 0) == 4

    done = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert done["status"] == "executed", done["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 5
    (dead,) = read_all(kafka_bootstrap, f"{topic}.dlq")
    assert dead.value() == b"v4" and dead.key() == b"k"
    headers = dict(dead.headers())
    assert headers["lagdoctor.original.offset"] == b"4" and headers["lagdoctor.original.topic"] == topic.encode()
    assert headers["lagdoctor.original.partition"] == b"0" and headers["lagdoctor.group"] == group.encode()
    # the copy names the attempt that made it, as the action log does
    assert headers["lagdoctor.idempotency_key"] == done["idempotency_key"].encode()

    # A retried task of the same run neither skips a second record nor copies again.
    again = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert again == done
    assert committed(kafka_bootstrap, group, topic, 0) == 5
    assert len(read_all(kafka_bootstrap, f"{topic}.dlq")) == 1


def test_skip_poison_pill_refuses_when_the_offset_moved_since_the_plan(settings, kafka_bootstrap, kafka_cluster, unique):
    topic, group = unique("orders"), unique("orders-group")
    create_topics(kafka_bootstrap, topic)
    produce(kafka_bootstrap, topic, [b"a", b"b", b"c"])
    commit(kafka_bootstrap, group, topic, 0, 1)
    f = stalled(kafka_cluster, group, topic, 1)
    from lagdoctor.remediation.actions import ActionContext
    from lagdoctor.remediation.config import RemediationConfig
    from lagdoctor.remediation.kafka_ops import SkipPoisonPill, kafka_config_for

    action = SkipPoisonPill()
    ctx = ActionContext(f, RemediationConfig(), {}, T0, lambda: kafka_config_for(kafka_cluster))
    plan = action.resolve(ctx, action.prepare(ctx))
    commit(kafka_bootstrap, group, topic, 0, 3)  # the consumers came back and moved on meanwhile
    from lagdoctor.remediation.actions import ActionBlocked

    with pytest.raises(ActionBlocked, match="moved from offset 1 to 3"):
        action.apply(ctx, plan)
    assert committed(kafka_bootstrap, group, topic, 0) == 3


def test_skip_poison_pill_never_skips_a_record_other_than_the_approved_one(settings, kafka_bootstrap, kafka_cluster,
                                                                           unique):
    topic, group = unique("orders"), unique("orders-group")
    create_topics(kafka_bootstrap, topic)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(8)])
    commit(kafka_bootstrap, group, topic, 0, 4)
    f = stalled(kafka_cluster, group, topic, 4)  # the finding (and so the approval) showed offset 4
    commit(kafka_bootstrap, group, topic, 0, 6)  # someone moved the group before the approved run
    done = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert done["status"] == "blocked"
    assert "partition 0 is at offset 6, not 4 as approved" in done["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 6
    assert read_all(kafka_bootstrap, f"{topic}.dlq") == []


def _stuck_at_4(kafka_bootstrap, unique):
    topic, group = unique("orders"), unique("orders-group")
    create_topics(kafka_bootstrap, topic)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(8)])
    commit(kafka_bootstrap, group, topic, 0, 4)
    return topic, group


def test_skip_poison_pill_retried_after_its_commit_failed_copies_the_record_once(
        settings, kafka_bootstrap, kafka_cluster, unique, monkeypatch):
    """Issue 30: the copy landed, then the commit failed (a timeout, a coordinator moving); the
    task's retry copied the record again. Copy and commit are one transaction: both or neither."""
    from lagdoctor.remediation import kafka_ops

    topic, group = _stuck_at_4(kafka_bootstrap, unique)
    real, failures = kafka_ops._commit_past, []

    def commit_fails_once(*args, **kwargs):
        if not failures:
            failures.append("commit")
            raise RuntimeError("partition 0: commit failed (Broker: Request timed out)")
        return real(*args, **kwargs)

    monkeypatch.setattr(kafka_ops, "_commit_past", commit_fails_once)
    f = stalled(kafka_cluster, group, topic, 4)
    with pytest.raises(RemediationFailed, match="commit failed"):
        run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert committed(kafka_bootstrap, group, topic, 0) == 4
    assert read_all(kafka_bootstrap, f"{topic}.dlq") == []  # the failed attempt's copy never shows

    retried = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert retried["status"] == "executed", retried["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 5
    assert [m.value() for m in read_all(kafka_bootstrap, f"{topic}.dlq")] == [b"v4"]


def test_skip_poison_pill_resumed_after_its_worker_died_between_copy_and_commit_copies_the_record_once(
        settings, kafka_bootstrap, kafka_cluster, unique):
    """Issue 30: a worker killed after the copy reached the broker and before the commit (no
    cleanup, no outcome recorded); the retry resumes the `started` plan and must not copy again."""
    import os
    import subprocess
    import sys
    import textwrap

    from lagdoctor.remediation.audit import ActionLog

    topic, group = _stuck_at_4(kafka_bootstrap, unique)
    f = stalled(kafka_cluster, group, topic, 4)
    worker = textwrap.dedent("""
        import json, os, sys
        from datetime import datetime
        from lagdoctor.remediation import kafka_ops, run_action
        kafka_ops._commit_past = lambda *args, **kwargs: os._exit(9)  # dies here: no except, no finally
        run_action("skip_poison_pill", json.loads(sys.argv[1]), run_id="r1", dry_run=False, approved=True,
                   now=datetime.fromisoformat(sys.argv[2]))
    """)
    died = subprocess.run([sys.executable, "-c", worker, json.dumps(f), T0.isoformat()], env=os.environ,
                          capture_output=True, text=True, timeout=180)
    assert died.returncode == 9, died.stderr[-2000:]
    assert [r["status"] for r in ActionLog.from_settings(settings).records()] == ["started"]
    assert len(read_all(kafka_bootstrap, f"{topic}.dlq", isolation="read_uncommitted")) == 1  # the copy landed
    assert committed(kafka_bootstrap, group, topic, 0) == 4

    resumed = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert resumed["status"] == "executed", resumed["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 5
    (dead,) = read_all(kafka_bootstrap, f"{topic}.dlq")
    assert dead.value() == b"v4" and dict(dead.headers())["lagdoctor.original.offset"] == b"4"


def _owners(bootstrap, group):
    """{partition: member_id} of the group's current assignment."""
    with admin(bootstrap) as a:
        (desc,) = [f.result(timeout=30) for f in a.describe_consumer_groups([group]).values()]
    return {tp.partition: m.member_id for m in desc.members for tp in m.assignment.topic_partitions}


def test_add_partitions_grows_the_topic_and_the_group_rebalances_onto_them(settings, kafka_bootstrap, kafka_cluster,
                                                                          unique):
    import time

    from confluent_kafka import Consumer

    topic, group = unique("surge"), unique("surge-group")
    create_topics(kafka_bootstrap, topic)
    # a live member that refreshes metadata every second, so it sees new partitions soon
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "session.timeout.ms": 6000,
                         "topic.metadata.refresh.interval.ms": 1000, "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while set(_owners(kafka_bootstrap, group)) != {0, 1}:
            assert time.monotonic() < deadline, "the member never got partitions 0 and 1"
            consumer.poll(0.2)
        f = {"cluster": kafka_cluster, "group_id": group, "topic": topic, "partitions": [],
             "diagnosis": "producer_surge", "pattern": "explosion", "severity": "critical", "summary": "surge",
             "evidence": {"partition_count": 2}}
        assert run_action("add_partitions", f, run_id="r1", dry_run=False, now=T0)["status"] == "awaiting_approval"
        assert _owners(kafka_bootstrap, group).keys() == {0, 1}  # nothing changed while it waited

        rec = run_action("add_partitions", f, run_id="r1", dry_run=False, approved=True, now=T0)
        assert rec["status"] == "executed" and rec["detail"]["partitions"] == 4
        assert "grew " + topic + " from 2 to 4 partitions" in rec["message"]
        deadline = time.monotonic() + 60
        while set(_owners(kafka_bootstrap, group)) != {0, 1, 2, 3}:
            assert time.monotonic() < deadline, f"the group never took the new partitions: {_owners(kafka_bootstrap, group)}"
            consumer.poll(0.2)
        # a retried task of the same run does not grow the topic again
        assert run_action("add_partitions", f, run_id="r1", dry_run=False, approved=True, now=T0) == rec
        with admin(kafka_bootstrap) as a:
            assert len(a.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 4
    finally:
        consumer.close()


def test_add_partitions_for_several_groups_on_one_topic_grows_it_once(settings, kafka_bootstrap, kafka_cluster,
                                                                     unique):
    """Issue 30: a surge on a shared topic makes every group on it critical; approving each group's
    add_partitions grew the topic once per group (2 -> 4 -> 6 -> 8), each form line saying "grow by 2".
    The topic is the target: the first grows it; the same run's others say it was done for them
    (not blocked: the run does not fail); another run waits out the cooldown, saying so."""
    topic = unique("shared")
    create_topics(kafka_bootstrap, topic)
    records = []
    for k in range(3):
        f = {"cluster": kafka_cluster, "group_id": unique(f"g{k}"), "topic": topic, "partitions": [],
             "diagnosis": "producer_surge", "pattern": "explosion", "severity": "critical", "summary": "surge",
             "evidence": {"partition_count": 2, "group_members": 2}}
        records.append(run_action("add_partitions", f, run_id="r1", dry_run=False, approved=True, now=T0))
    assert [r["status"] for r in records] == ["executed", "noop", "noop"], records
    assert records[1]["message"] == (f"done in this run for group {records[0]['group_id']}: topic {topic} on "
                                     f"{kafka_cluster} is shared, its change covers this group too")
    later = run_action("add_partitions", {**f, "group_id": unique("g3")}, run_id="r2", dry_run=False,
                       approved=True, now=T0)
    assert later["status"] == "blocked" and "cooldown ends in" in later["message"], later
    assert f"add_partitions on topic {topic} on {kafka_cluster}" in later["message"], later["message"]
    with admin(kafka_bootstrap) as a:
        assert len(a.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 4


def test_add_partitions_on_a_topic_deleted_meanwhile_is_blocked_and_creates_nothing(settings, kafka_bootstrap,
                                                                                   kafka_cluster, unique):
    topic = unique("surge")
    create_topics(kafka_bootstrap, topic)
    f = {"cluster": kafka_cluster, "group_id": unique("g"), "topic": topic, "partitions": [],
         "diagnosis": "producer_surge", "pattern": "explosion", "severity": "critical", "summary": "surge",
         "evidence": {"partition_count": 2}}
    assert run_action("add_partitions", f, run_id="r1", dry_run=False, now=T0)["status"] == "awaiting_approval"
    with admin(kafka_bootstrap) as a:
        for fut in a.delete_topics([topic]).values():
            fut.result(timeout=30)
    rec = run_action("add_partitions", f, run_id="r1", dry_run=False, approved=True, now=T0)
    assert rec["status"] == "blocked" and rec["message"].endswith(f"topic '{topic}' not found")
    with admin(kafka_bootstrap) as a:
        assert topic not in a.list_topics(timeout=10).topics  # approving never re-creates a topic
    from lagdoctor.remediation.audit import ActionLog

    assert [r["status"] for r in ActionLog.from_settings(settings).records()] == ["awaiting_approval", "blocked"]


def test_skip_poison_pill_on_a_consumer_really_stuck_on_one_record(settings, kafka_bootstrap, kafka_cluster, unique):
    """A live member whose handler fails on offset 3: refused while it runs (STABLE, one member),
    done once it is stopped (EMPTY), and a restarted member goes on past the skipped record."""
    import time

    from lagdoctor.lab.workload import ThrottledConsumer

    topic, group = unique("payments"), unique("ledger")
    create_topics(kafka_bootstrap, topic, partitions=1)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(6)])
    stuck = ThrottledConsumer(kafka_bootstrap, group, topic, client_id="ledger-1", stuck_at={0: 3}).start()
    try:
        assert stuck.assigned.wait(30), "the consumer was never assigned"
        deadline = time.monotonic() + 30
        while committed(kafka_bootstrap, group, topic, 0) != 3:
            assert time.monotonic() < deadline, "the consumer never reached the poison record"
            time.sleep(0.2)
        f = stalled(kafka_cluster, group, topic, 3)
        refused = run_action("skip_poison_pill", f, run_id="r1", dry_run=False, approved=True, now=T0)
        assert refused["status"] == "blocked"
        assert "group is STABLE with 1 member(s), not EMPTY: stop its consumers first" in refused["message"]
        assert committed(kafka_bootstrap, group, topic, 0) == 3 and read_all(kafka_bootstrap, f"{topic}.dlq") == []
    finally:
        stuck.stop()  # the on-call stops the consumer, as the approval form asks

    done = run_action("skip_poison_pill", f, run_id="r2", dry_run=False, approved=True, now=T0)
    assert done["status"] == "executed", done["message"]
    assert committed(kafka_bootstrap, group, topic, 0) == 4
    assert [m.value() for m in read_all(kafka_bootstrap, f"{topic}.dlq")] == [b"v3"]

    resumed = ThrottledConsumer(kafka_bootstrap, group, topic, client_id="ledger-2").start()
    try:
        deadline = time.monotonic() + 30
        while committed(kafka_bootstrap, group, topic, 0) != 6:
            assert time.monotonic() < deadline, "the restarted consumer did not go on past the skipped record"
            time.sleep(0.2)
    finally:
        resumed.stop()


@pytest.mark.parametrize("crash_from_read, audited", [
    (1, ["blocked"]),  # resolve's read: the plan is never fixed
    (2, ["started", "blocked"]),  # apply's re-read, after the claim: nothing copied, nothing committed
], ids=["resolve", "apply"])
def test_skip_poison_pill_is_blocked_in_one_line_when_the_group_reader_crashes(
        settings, kafka_bootstrap, kafka_cluster, unique, monkeypatch, tmp_path, crash_from_read, audited):
    """librdkafka's OffsetFetch SIGSEGV during a broker restart (issue 5040) kills the child
    that reads the group, not the task: the action is blocked saying so, never "no commit"."""
    from lagdoctor.kafka import group_reads
    from lagdoctor.remediation.audit import ActionLog

    topic, group = unique("orders"), unique("orders-group")
    create_topics(kafka_bootstrap, topic)
    create_topics(kafka_bootstrap, f"{topic}.dlq", partitions=1)
    produce(kafka_bootstrap, topic, [f"v{i}".encode() for i in range(8)])
    commit(kafka_bootstrap, group, topic, 0, 4)
    # The group reader's fault hook: the child dies of SIGSEGV from its Nth start on (a retry included).
    starts = tmp_path / "child-starts"
    monkeypatch.setattr(group_reads, "_CHILD_MAIN", (
        f"import os, signal; f = open({str(starts)!r}, 'a+'); f.write('.'); f.seek(0); n = len(f.read()); "
        f"f.close(); n >= {crash_from_read} and os.kill(os.getpid(), signal.SIGSEGV); " + group_reads._CHILD_MAIN))

    rec = run_action("skip_poison_pill", stalled(kafka_cluster, group, topic, 4), run_id="r1", dry_run=False,
                     approved=True, now=T0)
    assert rec["status"] == "blocked"
    assert rec["message"] == (
        f"cannot read group {group}, nothing was changed: committed offsets: not read: the Kafka client crashed "
        "(SIGSEGV) reading the consumer groups, a librdkafka bug a broker restart triggers")
    assert committed(kafka_bootstrap, group, topic, 0) == 4
    assert read_all(kafka_bootstrap, f"{topic}.dlq") == []
    assert [r["status"] for r in ActionLog.from_settings(settings).records()] == audited
    assert len(starts.read_text()) == crash_from_read + 1  # the crashed read was tried twice, then gave up
