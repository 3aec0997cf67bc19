"""One membership change is one rebalance, live on Apache Kafka (issue 16, rule case 20).

Each scenario plays real clients against the session's broker while a thread takes
snapshots back to back, stamped NOW plus the time since the scenario began (the clock
passed in, never the wall clock's), writes them to a store, and one diagnosis on the
session's Spark reads them all:

- a cooperative-sticky group scaling 2 -> 3: an incremental rebalance is two rounds
  (revoke, then assign) with a STABLE generation between them in which the moved
  partitions have no owner; the members here hold that generation open in their
  on_revoke handlers, as one that commits or flushes state there does;
- a KIP-848 group scaling 2 -> 3 and 3 -> 2: no PREPARING_REBALANCE; the group is
  ASSIGNING (the coordinator has not computed the new target yet: seen after every
  leave here, after some joins), then RECONCILING;
- a member joining and leaving again and again under cooperative-sticky: a loop.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.contracts import REBALANCING_GROUP_STATES
from lagdoctor.kafka.clients import admin_client, client_config
from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.lab.workload import SteadyProducer, ThrottledConsumer, create_topic
from lagdoctor.store import write_snapshot

pytestmark = [pytest.mark.broker, pytest.mark.spark]

NOW = datetime(2026, 11, 26, 3, 14, tzinfo=timezone.utc)
PARTITIONS = 6
COOPERATIVE = {"partition.assignment.strategy": "cooperative-sticky"}
KIP848 = {"group.protocol": "consumer"}


class Snapshots:
    """Snapshots of one group, back to back on a thread, each stamped NOW + the time since the first.

    The collector reads groups in this process when given an AdminClient it did not
    build (the same reads, without the child process a sweep uses against librdkafka's
    crashes): about 40 ms a snapshot instead of 400, so a round under a second is seen.
    """

    def __init__(self, bootstrap: str, group: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(client_config(bootstrap))
        self.bootstrap, self.group = bootstrap, group
        self.taken: list = []  # pyarrow tables, oldest first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"snapshots-{group}", daemon=True)

    def __enter__(self) -> "Snapshots":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        # Real spacing: a rebalance held for two seconds is two seconds, not a stall of minutes.
        started = time.monotonic()
        while not self._stop.is_set():
            now = NOW + timedelta(seconds=time.monotonic() - started)
            self.taken.append(collect_snapshot(self.admin, "local", re.escape(self.group), now,
                                               bootstrap=self.bootstrap, record_partitions=0))

    def wait_for(self, predicate, what: str, timeout_s: float = 30.0, *, begin: bool = False) -> list[dict]:
        """The rows of the first snapshot taken from now on that satisfy `predicate`;
        `begin`: the history starts there (what came before is dropped)."""
        seen, deadline = len(self.taken), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while seen < len(self.taken):
                rows = self.taken[seen].to_pylist()
                if predicate(rows):
                    if begin:
                        del self.taken[:seen]
                    return rows
                seen += 1
            time.sleep(0.02)
        raise AssertionError(f"{self.group}: no snapshot showed {what} within {timeout_s:g} s")

    def more(self, n: int, timeout_s: float = 30.0) -> None:
        target, deadline = len(self.taken) + n, time.monotonic() + timeout_s
        while len(self.taken) < target:
            assert time.monotonic() < deadline, f"{self.group}: snapshots stopped"
            time.sleep(0.02)

    def write(self, store: str) -> list[list[dict]]:
        """One file for the whole history (a file per snapshot costs Spark a task each); its rows per snapshot."""
        import pyarrow as pa

        write_snapshot(pa.concat_tables(self.taken), store, "local", NOW)
        return [t.to_pylist() for t in self.taken]


def owners(rows: list[dict]) -> set[str | None]:
    return {r["client_id"] for r in rows}


def settled(clients: set[str]):
    """STABLE, every partition owned, by exactly these clients."""
    return lambda rows: ({r["group_state"] for r in rows} == {"STABLE"} and len(rows) == PARTITIONS
                         and owners(rows) == clients)


def phases(taken: list[list[dict]]) -> list[str]:
    """The group's course, one entry per run of alike snapshots."""
    out: list[str] = []
    for rows in taken:
        (state,) = {r["group_state"] for r in rows}
        if state in REBALANCING_GROUP_STATES:
            phase = "rebalancing"
        elif any(r["member_id"] is None for r in rows):
            phase = f"{state}, partitions unowned"
        else:
            phase = state
        if not out or out[-1] != phase:
            out.append(phase)
    return out


class RevokeGate:
    """An on_revoke handler that, once armed, waits until opened. Unarmed it passes: the
    first two members may settle in two generations (one joins after the other's first
    assignment, as a loaded machine makes likely), and that revoke must not hang."""

    def __init__(self) -> None:
        self.armed, self.entered, self.opened = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, partitions: list[int]) -> None:
        if not self.armed.is_set() or not partitions:
            return
        self.entered.set()
        self.opened.wait(30)


class Scenario:
    def __init__(self, bootstrap: str, name: str, config: dict) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.bootstrap, self.config = bootstrap, config
        self.topic, self.group = f"{name}-in-{suffix}", f"{name}-{suffix}"
        self.members: dict[str, ThrottledConsumer] = {}
        create_topic(bootstrap, self.topic, PARTITIONS)
        self.producer = SteadyProducer(bootstrap, self.topic, list(range(PARTITIONS)), 20).start()

    def join(self, client_id: str, **options) -> ThrottledConsumer:
        member = ThrottledConsumer(self.bootstrap, self.group, self.topic, client_id=client_id,
                                   config={**self.config, **options.pop("config", {})}, **options).start()
        self.members[client_id] = member
        return member

    def leave(self, client_id: str) -> None:
        self.members.pop(client_id).stop()

    def close(self) -> None:
        for member in self.members.values():
            member.stop()
        self.producer.stop()


def set_kip848_heartbeat(bootstrap: str, group: str, ms: int) -> None:
    """The group's heartbeat interval (the broker's, 5 s by default, paces a KIP-848 reconciliation)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.heartbeat.interval.ms", str(ms), incremental_operation=AlterConfigOpType.SET)])
    admin = admin_client(bootstrap)  # referenced until answered: a collected client fails its futures
    for _, fut in admin.incremental_alter_configs([resource]).items():
        fut.result()


def cooperative_scale_out(bootstrap: str, store: str) -> dict:
    s = Scenario(bootstrap, "coop-scale", COOPERATIVE)
    # Slow heartbeats: the old members hear of the first round up to 3 s late, so it lasts long enough to see.
    slow = {"heartbeat.interval.ms": 3000, "session.timeout.ms": 10000}
    gates = {c: RevokeGate() for c in ("c0", "c1")}
    try:
        for c, gate in gates.items():
            # c1 joins after c0 holds everything: the unarmed gates must let that revoke pass
            assert s.join(c, config=slow, on_revoke=gate).assigned.wait(30), f"{c} got no partitions"
        with Snapshots(bootstrap, s.group) as snaps:
            snaps.wait_for(settled({"c0", "c1"}), "two members owning everything", begin=True)
            snaps.more(3)
            for gate in gates.values():
                gate.armed.set()
            s.join("c2")
            # Round 1 revoked a partition from each old member: they wait in on_revoke.
            assert all(g.entered.wait(30) for g in gates.values())
            snaps.wait_for(lambda rows: {r["group_state"] for r in rows} == {"STABLE"}
                           and any(r["member_id"] is None for r in rows), "the STABLE generation between the rounds")
            snaps.more(3)
            gates["c0"].opened.set()  # c0 rejoins: round 2 starts, and waits for c1
            snaps.wait_for(lambda rows: {r["group_state"] for r in rows} <= REBALANCING_GROUP_STATES, "round 2")
            snaps.more(3)
            gates["c1"].opened.set()
            snaps.wait_for(settled({"c0", "c1", "c2"}), "three members owning everything")
            snaps.more(3)
    finally:
        for gate in gates.values():
            gate.opened.set()
        s.close()
    return {"group": s.group, "taken": snaps.write(store)}


def kip848_scale(bootstrap: str, store: str, direction: str) -> dict:
    s = Scenario(bootstrap, f"kip848-{direction}", KIP848)
    set_kip848_heartbeat(bootstrap, s.group, 1000)
    before, after = ({"c0", "c1"}, {"c0", "c1", "c2"}) if direction == "up" else ({"c0", "c1", "c2"}, {"c0", "c1"})
    try:
        for c in sorted(before):
            s.join(c)
        with Snapshots(bootstrap, s.group) as snaps:
            snaps.wait_for(settled(before), f"{len(before)} members owning everything", begin=True)
            snaps.more(3)
            if direction == "up":
                s.join("c2")
            else:
                s.leave("c2")
            snaps.wait_for(settled(after), f"{len(after)} members owning everything")
            snaps.more(3)
    finally:
        s.close()
    return {"group": s.group, "taken": snaps.write(store)}


def cooperative_loop(bootstrap: str, store: str, times: int = 3) -> dict:
    """A member that joins, takes its share, and leaves again, `times` times."""
    s = Scenario(bootstrap, "coop-loop", COOPERATIVE)
    try:
        s.join("c0")
        s.join("c1")
        with Snapshots(bootstrap, s.group) as snaps:
            snaps.wait_for(settled({"c0", "c1"}), "two members owning everything", begin=True)
            for _ in range(times):
                s.join("c2")
                snaps.wait_for(settled({"c0", "c1", "c2"}), "the third member in")
                s.leave("c2")
                snaps.wait_for(settled({"c0", "c1"}), "the third member out")
            snaps.more(3)
    finally:
        s.close()
    return {"group": s.group, "taken": snaps.write(store)}


def diagnose(spark, store: str) -> dict[str, list[dict]]:
    """The job's transforms over the whole store, findings by group."""
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.snapshots import read_snapshots

    snapshots = read_snapshots(spark, store)
    partitions = partition_features(snapshots).cache()
    by_group: dict[str, list[dict]] = {}
    for row in findings(partitions, group_features(group_series(snapshots, partitions))).collect():
        by_group.setdefault(row["group_id"], []).append(row.asDict(recursive=True))
    return by_group


@pytest.fixture(scope="module")
def played(kafka_bootstrap, spark, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("rebalances") / "snapshots")
    scenarios = {
        "cooperative": cooperative_scale_out(kafka_bootstrap, store),
        "kip848-up": kip848_scale(kafka_bootstrap, store, "up"),
        "kip848-down": kip848_scale(kafka_bootstrap, store, "down"),
        "loop": cooperative_loop(kafka_bootstrap, store),
    }
    found = diagnose(spark, store)
    for s in scenarios.values():
        s["findings"] = found[s["group"]]
    return scenarios


def rebalances(findings: list[dict]) -> int:
    (count,) = {f["evidence"]["rebalances"] for f in findings}  # a group-level number, the same in each
    return count


def test_a_cooperative_sticky_scale_out_is_one_rebalance(played):
    s = played["cooperative"]
    # Both rounds were seen, and the STABLE generation between them: what used to count twice.
    assert phases(s["taken"]) == ["STABLE", "rebalancing", "STABLE, partitions unowned", "rebalancing", "STABLE"]
    assert [f["diagnosis"] for f in s["findings"]] == ["healthy"], [f["summary"] for f in s["findings"]]
    assert rebalances(s["findings"]) == 1


@pytest.mark.parametrize("direction, members", [("up", (2, 3)), ("down", (3, 2))])
def test_a_kip848_scaling_is_one_rebalance_in_kafka_states(played, direction, members):
    s = played[f"kip848-{direction}"]
    rows = [r for taken in s["taken"] for r in taken]
    assert {r["group_type"] for r in rows} == {"consumer"}
    # Kafka's own names for a KIP-848 group: never UNKNOWN while it assigns or reconciles.
    assert {r["group_state"] for r in rows} <= {"STABLE", "ASSIGNING", "RECONCILING"}
    assert phases(s["taken"]) == ["STABLE", "rebalancing", "STABLE"]
    assert (s["taken"][0][0]["group_members"], s["taken"][-1][0]["group_members"]) == members
    assert [f["diagnosis"] for f in s["findings"]] == ["healthy"], [f["summary"] for f in s["findings"]]
    assert rebalances(s["findings"]) == 1


def test_a_member_joining_and_leaving_again_and_again_is_a_rebalance_loop(played):
    s = played["loop"]
    loop = [f for f in s["findings"] if f["diagnosis"] == "rebalance_loop"]
    assert len(loop) == 1, [f["summary"] for f in s["findings"]]
    # three joins and three leaves: six rebalances, each counted once
    assert rebalances(s["findings"]) == 6
    assert loop[0]["summary"].startswith("6 rebalances")
