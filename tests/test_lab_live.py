"""The demo's live incidents on a real broker: a killed consumer process empties its
group once its session times out, and a member slower than max.poll.interval.ms
keeps changing its group's owners (what the rebalance_loop rule counts)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

import pytest

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.kafka.clients import admin_client
from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.lab.demo import LOOP_MEMBER, live_incidents, played_against_found
from lagdoctor.lab.workload import ConsumerProcess, SteadyProducer, create_topic

broker = pytest.mark.broker


def snapshot(bootstrap: str, group: str) -> list[dict]:
    return collect_snapshot(admin_client(bootstrap), "local", re.escape(group),
                            datetime.now(timezone.utc)).to_pylist()


@broker
def test_a_killed_consumer_process_leaves_its_group_empty_after_its_session_times_out(kafka_bootstrap, unique):
    topic, group = unique("mail"), unique("mailer")
    create_topic(kafka_bootstrap, topic, 2)
    producer = SteadyProducer(kafka_bootstrap, topic, [0, 1], 20).start()
    consumer = ConsumerProcess(kafka_bootstrap, group, topic, client_id="mailer-1").start()
    try:
        assert consumer.assigned.wait(60), "the consumer process never got partitions"
        rows = snapshot(kafka_bootstrap, group)
        assert {(r["group_state"], r["group_members"], r["client_id"]) for r in rows} == {("STABLE", 1, "mailer-1")}

        consumer.kill()
        assert not consumer.alive()
        state, deadline = "STABLE", time.monotonic() + 20  # session.timeout.ms is 6 s
        while state != "EMPTY" and time.monotonic() < deadline:
            time.sleep(0.5)
            rows = snapshot(kafka_bootstrap, group)
            state = rows[0]["group_state"]
        assert state == "EMPTY", "the group kept its killed member"
        assert {r["group_members"] for r in rows} == {0}
        assert {r["member_id"] for r in rows} == {None}
        time.sleep(2)
        assert sum(r["lag"] for r in snapshot(kafka_bootstrap, group)) > sum(r["lag"] for r in rows)
    finally:
        consumer.stop()
        producer.stop()


@broker
def test_the_demo_loop_member_changes_the_owners_at_least_as_often_as_a_loop_needs(kafka_bootstrap, unique):
    topic, group = unique("inventory"), unique("inventory-sync")
    create_topic(kafka_bootstrap, topic, 2)
    producer = SteadyProducer(kafka_bootstrap, topic, [0, 1], 20).start()
    members = [ConsumerProcess(kafka_bootstrap, group, topic, client_id="sync-1").start(),
               ConsumerProcess(kafka_bootstrap, group, topic, client_id="sync-2", **LOOP_MEMBER).start()]
    try:
        assert all(m.assigned.wait(60) for m in members)
        owner_sets, started = [], time.monotonic()
        while time.monotonic() - started < 25:  # the demo samples every 5 s for 60 s
            owner_sets.append(frozenset(r["member_id"] for r in snapshot(kafka_bootstrap, group) if r["member_id"]))
            time.sleep(2.5)
        changes = sum(1 for a, b in zip(owner_sets, owner_sets[1:]) if a and b and a != b)
        assert changes >= Thresholds().rebalance_loop_min
        assert all(m.alive() for m in members), "an evicted member rejoins; it does not die"
    finally:
        for m in members:
            m.stop()
        producer.stop()


def test_the_demo_says_which_incidents_the_sweep_misread():
    findings = [{"group_id": i.group, "diagnosis": i.expect} for i in live_incidents()]
    findings[1] = {**findings[1], "diagnosis": "slow_consumer"}
    lines = played_against_found(live_incidents(), findings)
    assert [ok for _, ok in lines].count(False) == 1
    assert lines[1][0].split()[:2] == ["MISS", "clicks-aggregator"]
    assert "found slow_consumer" in lines[1][0]
