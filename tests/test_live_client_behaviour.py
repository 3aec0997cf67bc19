"""Real client behaviour on Apache Kafka that a Kafka-compatible test broker could not show
(issue 16, rule cases 18 and 19): each scenario plays real clients against the session's
broker, takes snapshots with the collector at a clock passed in (a minute apart), and one
run of the real job diagnoses them all.

- A consumer that assign()s its partitions and commits without joining the group leaves
  its group EMPTY with no members: keeping up it is healthy, never "crashed"; stopped,
  it is stalled and the finding says no member list can exist for it; skip_poison_pill
  refuses it (EMPTY proves nothing there).
- A rolling restart of three static members (group.instance.id): each comes back with
  a new member id and no rebalance, so it is not a rebalance loop.
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
STEPS = 9  # snapshots, a minute apart by the clock passed in
PER_STEP = 200  # records per partition between snapshots (3.3 msg/s)
IN_FLIGHT = 20  # records per partition a live consumer has not committed yet at a snapshot


class AssignConsumer:
    """A consumer outside the group protocol, as Flink or Spark run one: assign(), read,
    commit synchronously through the group id, never subscribe."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: list[int]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.consumer = Consumer(client_config(bootstrap, {
            "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
        self.consumer.assign([TopicPartition(topic, p) for p in partitions])
        self.topic, self.position = topic, {p: 0 for p in partitions}

    def catch_up(self, ends: dict[int, int], timeout_s: float = 30.0) -> None:
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + timeout_s
        while any(self.position[p] < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"assign() consumer stuck at {self.position}, ends {ends}"
            for msg in self.consumer.consume(500, timeout=0.2):
                p = msg.partition()
                if not msg.error() and self.position[p] < ends[p]:
                    self.position[p] = msg.offset() + 1
                    if self.position[p] == ends[p]:  # read no further on this partition for now
                        self.consumer.pause([TopicPartition(self.topic, p)])
        self.consumer.resume([TopicPartition(self.topic, p) for p in ends])
        for p, at in self.position.items():
            self.consumer.seek(TopicPartition(self.topic, p, at))
        self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in self.position.items()],
                             asynchronous=False)

    def close(self) -> None:
        self.consumer.close()


class StaticMembers:
    """Three pods of one group with static membership (group.instance.id pod-0..2), each a
    live consumer; `restart(i)` replaces pod i's consumer as a rolling deploy does."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.pods = [self._start(i) for i in range(3)]

    def _start(self, i: int):
        from lagdoctor.lab.workload import ThrottledConsumer

        # A static member's close sends no LeaveGroup: its replacement, back within the
        # session timeout under the same instance id, takes its partitions without a rebalance.
        return ThrottledConsumer(self.bootstrap, self.group, self.topic, client_id=f"pod-{i}",
                                 config={"group.instance.id": f"pod-{i}", "session.timeout.ms": 20000}).start()

    def restart(self, i: int) -> None:
        self.pods[i].stop()
        self.pods[i] = self._start(i)
        assert self.pods[i].assigned.wait(30), f"pod-{i} did not get its partitions back"

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop()


def _wait_for_commits(admin, group: str, topic: str, ends: dict[int, int], timeout_s: float = 30.0) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in ends])]
        got = {tp.partition: tp.offset for tp in
               admin.list_consumer_group_offsets(request)[group].result(10).topic_partitions}
        if got == ends:
            return
        assert time.monotonic() < deadline, f"commits of {group}: {got}, expected {ends}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def live_history(kafka_bootstrap, tmp_path_factory):
    """Plays every scenario, one snapshot per step, and runs the job once over them."""
    suffix = uuid.uuid4().hex[:6]
    keeps_up = {"topic": f"flink-in-{suffix}", "group": f"flink-job-{suffix}"}
    stops = {"topic": f"spark-in-{suffix}", "group": f"spark-stream-{suffix}"}
    rolling = {"topic": f"orders-{suffix}", "group": f"orders-static-{suffix}"}
    for s in (keeps_up, stops):
        create_topic(kafka_bootstrap, s["topic"], 2)
        s["consumer"] = AssignConsumer(kafka_bootstrap, s["group"], s["topic"], [0, 1])
    create_topic(kafka_bootstrap, rolling["topic"], 3)
    pods = StaticMembers(kafka_bootstrap, rolling["group"], rolling["topic"])
    store = tmp_path_factory.mktemp("live") / "snapshots"
    admin = admin_client(kafka_bootstrap)
    scenarios = (keeps_up, stops, rolling)
    pattern = "|".join(re.escape(s["group"]) for s in scenarios)
    member_ids: list[set[str]] = []
    try:
        for k in range(STEPS):
            end = PER_STEP * (k + 1)
            for s in scenarios:
                produce_counts(kafka_bootstrap, s["topic"], {p: PER_STEP for p in range(3 if s is rolling else 2)})
            # a live job is always a little behind (lag > 0 at every snapshot), as one at 20 msg/s is
            keeps_up["consumer"].catch_up({0: end - IN_FLIGHT, 1: end - IN_FLIGHT})
            if k < 3:  # the streaming job dies after three minutes; its process is gone
                stops["consumer"].catch_up({0: end - IN_FLIGHT, 1: end - IN_FLIGHT})
            elif k == 3:
                stops["consumer"].close()
            if 2 <= k <= 4:  # a rolling deploy: one pod a minute
                pods.restart(k - 2)
            _wait_for_commits(admin, rolling["group"], rolling["topic"], {0: end, 1: end, 2: end})
            now = NOW + timedelta(minutes=k)
            table = collect_snapshot(admin, "local", pattern, now, bootstrap=kafka_bootstrap)
            member_ids.append({r["member_id"] for r in table.to_pylist() if r["group_id"] == rolling["group"]})
            write_snapshot(table, str(store), "local", now)
    finally:
        keeps_up["consumer"].close()
        pods.stop()
    out = store.parent / "findings"
    run_job(store, out, "--as-of", (NOW + timedelta(minutes=STEPS - 1)).isoformat(), "--window-minutes", "15")
    findings = read_jsonl(out / "findings.jsonl")
    by_group = {}
    for f in findings:
        by_group.setdefault(f["group_id"], []).append(f)
    return {"keeps_up": by_group[keeps_up["group"]], "stops": by_group[stops["group"]],
            "rolling": by_group[rolling["group"]], "rolling_member_ids": member_ids, "store": store}


def test_an_assign_consumer_that_keeps_up_is_healthy_not_crashed(live_history):
    (finding,) = live_history["keeps_up"]
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["group_state"] == "EMPTY" and finding["evidence"]["group_members"] == 0
    assert finding["evidence"]["membership"] == "outside"


def test_an_assign_consumer_that_stops_is_stalled_and_no_member_list_can_exist(live_history):
    diagnoses = {f["diagnosis"]: f for f in live_history["stops"]}
    assert "crashed_consumer" not in diagnoses
    stalled = diagnoses["stalled_consumer"]
    assert stalled["partitions"] == [0, 1]
    assert "outside the group protocol" in stalled["summary"] and "no member list can exist" in stalled["summary"]
    assert stalled["evidence"]["membership"] == "outside"


def test_skip_poison_pill_refuses_a_group_consumed_outside_the_protocol(live_history):
    from lagdoctor.remediation import ActionBlocked, RemediationConfig, get_action
    from lagdoctor.remediation.actions import ActionContext

    stalled = next(f for f in live_history["stops"] if f["diagnosis"] == "stalled_consumer")
    ctx = ActionContext(finding=stalled, config=RemediationConfig(), params={}, now=NOW, kafka_config=dict)
    with pytest.raises(ActionBlocked, match="outside the group protocol.*EMPTY does not show"):
        get_action("skip_poison_pill").prepare(ctx)


def test_a_static_membership_rolling_restart_is_not_a_rebalance_loop(live_history):
    # Every restart gave its pod a new member id (what used to count as churn) ...
    ids = live_history["rolling_member_ids"]
    assert all(len(i) == 3 and None not in i for i in ids)
    assert sum(1 for before, after in zip(ids, ids[1:]) if before != after) == 3
    # ... but the same instance ids owned the same partitions throughout: no rebalance.
    (finding,) = live_history["rolling"]
    assert finding["diagnosis"] == "healthy", finding["summary"]
    assert finding["evidence"]["owner_changes"] == 0 and finding["evidence"]["group_state"] == "STABLE"
