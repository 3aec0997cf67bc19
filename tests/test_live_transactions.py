"""Transactional topics on Apache Kafka (issue 16, rule case 21): real transactional
producers, read_committed and read_uncommitted groups, snapshots taken with the
collector at a clock passed in (a minute apart), one run of the real job over them.

- flow: a transaction is always open at a snapshot. The read_uncommitted group is
  ahead of the last stable offset, at the high watermark: lag 0, no "offset reset".
  The read_committed group waits at the last stable offset: its lag is the open
  transaction's records, and it is healthy.
- held: a transaction left open (its producer never commits) while other records
  arrive. The read_committed group cannot pass it: stalled, and the finding names
  the open transaction, not a stuck record. The read_uncommitted group keeps up and
  its finding lists the partition the transaction holds.
- marker: a consumer that commits offset + 1 of the last record it handled (as a
  Java consumer does) sits on the transaction's commit marker, then stops. The
  record read skips the marker to the next data record and says so.
- idle: the same consumer on a topic with no more traffic: its lag is the marker
  alone, nothing to read, so it is healthy, never stalled.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.kafka.clients import admin_client, client_config
from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.lab.workload import create_topic, produce_counts
from lagdoctor.store import write_snapshot
from tests.fixtures.spark import read_jsonl, run_job

pytestmark = [pytest.mark.broker, pytest.mark.spark]

NOW = datetime(2026, 11, 25, 3, 14, tzinfo=timezone.utc)
STEPS = 6  # snapshots, a minute apart by the clock passed in
OPEN = 1_500  # records of the transaction open at each snapshot (flow)
HELD_AT = 200  # records before the transaction left open (held)


def _offsets(admin, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of partition 0."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    tp = TopicPartition(topic, 0)
    hwm = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_UNCOMMITTED)
    lso = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED)
    return hwm[tp].result(10).offset, lso[tp].result(10).offset


def _stable_offsets(admin, topic: str, timeout_s: float = 10.0) -> tuple[int, int]:
    """As _offsets, once the markers of transactions just committed are written (the
    last stable offset stays at an ended transaction's start until they are)."""
    deadline = time.monotonic() + timeout_s
    before = None
    while True:
        now = _offsets(admin, topic)
        if now == before:
            return now
        assert time.monotonic() < deadline, f"offsets of {topic} keep moving: {now}"
        before = now
        time.sleep(0.3)


def _transactional_producer(bootstrap: str, name: str):
    from confluent_kafka import Producer

    # A transaction left open must outlive the test's minutes of real time.
    producer = Producer(client_config(bootstrap, {"transactional.id": name, "transaction.timeout.ms": 600_000}))
    producer.init_transactions(30)
    return producer


def _transaction(producer, topic: str, count: int, *, commit: bool = True) -> None:
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)


class StepConsumer:
    """A group member driven step by step: `drain(to)` reads until its position reaches
    `to` and commits; with `commit_last_record_plus_one` it commits the last handled
    record's offset + 1 (a Java consumer's usual commit) instead of its position."""

    def __init__(self, bootstrap: str, group: str, topic: str, isolation: str,
                 commit_last_record_plus_one: bool = False) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(client_config(bootstrap, {
            "group.id": group, "client.id": f"{group}-0", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": isolation}))
        self.consumer.subscribe([topic])
        self.topic, self.plus_one = topic, commit_last_record_plus_one
        self.last: int | None = None

    def position(self) -> int:
        from confluent_kafka import TopicPartition

        (tp,) = self.consumer.position([TopicPartition(self.topic, 0)])
        return max(tp.offset, 0)  # nothing fetched yet: OFFSET_INVALID

    def drain(self, to: int, timeout_s: float = 30.0) -> None:
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + timeout_s
        while self.position() < to:
            assert time.monotonic() < deadline, f"{self.topic}: position {self.position()}, wanted {to}"
            for msg in self.consumer.consume(1000, timeout=0.2):
                if not msg.error():
                    self.last = msg.offset()
        at = self.last + 1 if self.plus_one and self.last is not None else self.position()
        if at == 0:
            return  # nothing read: no commit yet
        self.consumer.commit(offsets=[TopicPartition(self.topic, 0, at)], asynchronous=False)

    def idle(self) -> None:
        """Stay a member without reading: poll with the partition paused."""
        from confluent_kafka import TopicPartition

        self.consumer.pause([TopicPartition(self.topic, 0)])
        self.consumer.poll(0.2)

    def close(self) -> None:
        self.consumer.close()


@pytest.fixture(scope="module")
def txn_history(kafka_bootstrap, tmp_path_factory):
    suffix = uuid.uuid4().hex[:6]
    topics = {name: f"{name}-tx-{suffix}" for name in ("flow", "held", "marker", "idle")}
    for topic in topics.values():
        create_topic(kafka_bootstrap, topic, 1)
    admin = admin_client(kafka_bootstrap)
    producers = {name: _transactional_producer(kafka_bootstrap, f"{topic}-producer") for name, topic in topics.items()}
    groups = {
        "flow_rc": StepConsumer(kafka_bootstrap, f"flow-rc-{suffix}", topics["flow"], "read_committed"),
        "flow_ru": StepConsumer(kafka_bootstrap, f"flow-ru-{suffix}", topics["flow"], "read_uncommitted"),
        "held_rc": StepConsumer(kafka_bootstrap, f"held-rc-{suffix}", topics["held"], "read_committed"),
        "held_ru": StepConsumer(kafka_bootstrap, f"held-ru-{suffix}", topics["held"], "read_uncommitted"),
        "marker": StepConsumer(kafka_bootstrap, f"marker-java-{suffix}", topics["marker"], "read_committed",
                               commit_last_record_plus_one=True),
        "idle": StepConsumer(kafka_bootstrap, f"idle-java-{suffix}", topics["idle"], "read_committed",
                             commit_last_record_plus_one=True),
    }
    group_ids = {"flow_rc": f"flow-rc-{suffix}", "flow_ru": f"flow-ru-{suffix}", "held_rc": f"held-rc-{suffix}",
                 "held_ru": f"held-ru-{suffix}", "marker": f"marker-java-{suffix}", "idle": f"idle-java-{suffix}"}
    pattern = "|".join(re.escape(g) for g in group_ids.values())
    store = tmp_path_factory.mktemp("txn") / "snapshots"
    rows: dict[str, list[dict]] = {name: [] for name in group_ids}
    # Before the first snapshot: committed data, then a transaction left open (held);
    # one committed transaction the Java-style consumers read (marker, idle).
    produce_counts(kafka_bootstrap, topics["held"], {0: HELD_AT})
    _transaction(producers["held"], topics["held"], 5, commit=False)
    for name in ("marker", "idle"):
        _transaction(producers[name], topics[name], 10)
        groups[name].drain(_stable_offsets(admin, topics[name])[1])
    try:
        for k in range(STEPS):
            if k > 0:
                producers["flow"].commit_transaction(30)
                _transaction(producers["marker"], topics["marker"], 10)
            _transaction(producers["flow"], topics["flow"], OPEN, commit=False)
            produce_counts(kafka_bootstrap, topics["held"], {0: HELD_AT})
            for name in ("flow", "held"):
                hwm, lso = _stable_offsets(admin, topics[name])
                groups[f"{name}_rc"].drain(lso)
                groups[f"{name}_ru"].drain(hwm)
            groups["marker"].idle()
            groups["idle"].idle()
            now = NOW + timedelta(minutes=k)
            table = collect_snapshot(admin, "local", pattern, now, bootstrap=kafka_bootstrap)
            for row in table.to_pylist():
                for name, group in group_ids.items():
                    if row["group_id"] == group:
                        rows[name].append(row)
            write_snapshot(table, str(store), "local", now)
    finally:
        producers["held"].abort_transaction(30)
        producers["flow"].abort_transaction(30)
        for consumer in groups.values():
            consumer.close()
    out = store.parent / "findings"
    run_job(store, out, "--as-of", (NOW + timedelta(minutes=STEPS - 1)).isoformat(), "--window-minutes", "15")
    by_group: dict[str, list[dict]] = {}
    for f in read_jsonl(out / "findings.jsonl"):
        by_group.setdefault(f["group_id"], []).append(f)
    return {name: {"findings": by_group[group], "rows": rows[name]} for name, group in group_ids.items()}


def _only(history, name):
    (finding,) = history[name]["findings"]
    return finding


def test_a_read_uncommitted_group_ahead_of_the_stable_offset_is_caught_up_not_reset(txn_history):
    last = txn_history["flow_ru"]["rows"][-1]
    assert last["last_stable_offset"] == last["log_end_offset"] - OPEN  # a transaction is open
    assert last["committed_offset"] == last["log_end_offset"] and last["lag"] == 0
    finding = _only(txn_history, "flow_ru")
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["offset_reset_partitions"] == [] and "went backwards" not in finding["summary"]
    assert finding["severity"] == "ok"


def test_a_read_committed_group_waits_at_the_stable_offset_and_its_lag_is_the_open_transaction(txn_history):
    last = txn_history["flow_rc"]["rows"][-1]
    assert last["committed_offset"] == last["last_stable_offset"]
    assert last["lag"] == OPEN  # what kafka-consumer-groups.sh shows: end offset minus committed
    finding = _only(txn_history, "flow_rc")
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["lag"] == OPEN and finding["evidence"]["hanging_transaction_partitions"] == []


def test_a_hanging_transaction_is_named_as_what_blocks_a_read_committed_group(txn_history):
    from lagdoctor.notify.render import stuck_record_text

    rows = txn_history["held_rc"]["rows"]
    assert {r["last_stable_offset"] for r in rows} == {HELD_AT}
    assert rows[-1]["committed_offset"] == HELD_AT and rows[-1]["lag"] == rows[-1]["log_end_offset"] - HELD_AT
    assert rows[-1]["committed_record_error"].startswith(f"at the last stable offset {HELD_AT}: ")
    diagnoses = {f["diagnosis"]: f for f in txn_history["held_rc"]["findings"]}
    stalled = diagnoses["stalled_consumer"]
    assert stalled["partitions"] == [0]
    assert "waits behind an open transaction" in stalled["summary"]
    assert f"the last stable offset has stood at {HELD_AT} for 5m00s" in stalled["summary"]
    assert "stopped committing" not in stalled["summary"]
    ev = stalled["evidence"]
    assert ev["transaction_blocked_partitions"] == [0] and ev["last_stable_offset"] == HELD_AT
    assert ev["transaction_open_seconds"] == 300.0
    assert "open transaction" in stuck_record_text(stalled)


def test_skip_poison_pill_refuses_a_group_blocked_by_a_transaction(txn_history):
    from lagdoctor.remediation import ActionBlocked, RemediationConfig, get_action
    from lagdoctor.remediation.actions import ActionContext

    stalled = next(f for f in txn_history["held_rc"]["findings"] if f["diagnosis"] == "stalled_consumer")
    ctx = ActionContext(finding=stalled, config=RemediationConfig(), params={}, now=NOW, kafka_config=dict)
    with pytest.raises(ActionBlocked, match="open transaction"):
        get_action("skip_poison_pill").prepare(ctx)


def test_a_read_uncommitted_group_past_a_hanging_transaction_keeps_up_and_is_told_of_it(txn_history):
    from lagdoctor.notify.render import incomplete_data_text

    finding = _only(txn_history, "held_ru")
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["lag"] == 0
    assert finding["evidence"]["hanging_transaction_partitions"] == [0]
    assert "open transaction holds the last stable offset on partition(s) 0" in incomplete_data_text(finding)


def test_a_commit_on_a_transaction_marker_reads_the_next_data_record_and_says_so(txn_history):
    from lagdoctor.notify.render import stuck_record_text, time_lag_text

    last = txn_history["marker"]["rows"][-1]
    assert last["committed_offset"] == 10  # offsets 0..9 data, 10 the commit marker
    assert last["committed_record_offset"] == 11 and last["committed_record_error"] is None
    stalled = next(f for f in txn_history["marker"]["findings"] if f["diagnosis"] == "stalled_consumer")
    ev = stalled["evidence"]
    assert ev["committed_record"]["offset"] == 11 and ev["committed_record"]["committed_offset"] == 10
    assert ev["time_lag_source"] == "next_record"
    assert "offset 11 (the next data record: 1 offset from the committed 10 hold transaction markers" in (
        stuck_record_text(stalled))
    assert time_lag_text(ev["time_lag_seconds"], ev["time_lag_source"]).endswith(
        "(exact, from the next data record's timestamp)")


def test_lag_that_is_only_a_commit_marker_is_caught_up_not_stalled(txn_history):
    rows = txn_history["idle"]["rows"]
    assert all(r["committed_offset"] == 10 and r["lag"] == 1 for r in rows)  # the marker at offset 10
    assert rows[-1]["committed_record_error"].startswith("nothing to read: offsets 10..10 hold transaction markers")
    finding = _only(txn_history, "idle")
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["time_lag_seconds"] == 0 and finding["evidence"]["time_lag_source"] == "caught_up"
