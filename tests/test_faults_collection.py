"""Collection under faults: a read that fails is recorded as unknown (never lag 0,
never a vanished group), a retried run samples nothing twice, and a broker that
dies between samples leaves the samples already taken intact and one clear line.

Failures the embedded broker cannot be made to produce (a coordinator still
loading, a ListOffsets timeout, a refused describe) come from `FailingAdmin`
(tests/fixtures/failing_admin.py): the real AdminClient talking to the real
broker, with the chosen futures replaced by failed ones.
"""

from __future__ import annotations

import re
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lagdoctor import store
from lagdoctor.kafka.clients import admin_client
from lagdoctor.kafka.collector import CollectionError, collect_snapshot, undiagnosed_groups
from lagdoctor.lab.workload import commit_offsets, create_topic, produce_counts
from lagdoctor.settings import Settings
from lagdoctor.stages.collect import take_snapshots
from tests.fixtures.failing_admin import FailingAdmin

pytestmark = pytest.mark.broker

NOW = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)


def by_group(table):
    out: dict[str, list[dict]] = {}
    for row in sorted(table.to_pylist(), key=lambda r: (r["group_id"], r["topic"], r["partition"])):
        out.setdefault(row["group_id"], []).append(row)
    return out


@pytest.fixture
def lagging(kafka_bootstrap, unique):
    """A 2-partition topic (5 and 5 records) and two EMPTY groups with commits: `hit` and `calm`."""
    topic, hit, calm = unique("faulty"), unique("hit"), unique("calm")
    create_topic(kafka_bootstrap, topic, 2)
    produce_counts(kafka_bootstrap, topic, {0: 5, 1: 5})
    commit_offsets(kafka_bootstrap, hit, topic, {0: 2, 1: 5})
    commit_offsets(kafka_bootstrap, calm, topic, {0: 5, 1: 1})
    return topic, hit, calm, f"{re.escape(hit)}|{re.escape(calm)}"


def test_failed_offset_fetch_of_an_empty_group_is_kept_as_unknown_never_lag_0(kafka_bootstrap, lagging, tmp_path):
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), offset_fetch={hit})
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap)
    # Kept through the store as well: the group must not vanish from what diagnosis reads.
    store.write_snapshot(table, str(tmp_path), "prod", NOW)
    groups = by_group(store.read_snapshots(str(tmp_path)))

    # An EMPTY group has no assignment to learn its topics from: one group row.
    (row,) = groups[hit]
    assert (row["topic"], row["partition"], row["group_state"], row["group_members"]) == ("", -1, "EMPTY", 0)
    assert (row["committed_offset"], row["lag"], row["log_end_offset"]) == (None, None, None)
    assert row["read_error"] == "committed offsets: Broker: Coordinator load in progress (COORDINATOR_LOAD_IN_PROGRESS)"
    # The other group is read as usual, and says so.
    assert [(r["partition"], r["lag"], r["read_error"]) for r in groups[calm]] == [(0, 0, None), (1, 4, None)]


def test_failed_offset_fetch_with_a_known_assignment_gives_unknown_rows_per_partition(kafka_bootstrap, lagging):
    from confluent_kafka import ConsumerGroupState, Node, TopicPartition
    from confluent_kafka.admin import ConsumerGroupDescription, MemberAssignment, MemberDescription

    topic, hit, calm, pattern = lagging
    # A live group's description is supplied (one member owning both partitions), so the
    # committed offsets stay exactly as the fixture set them.
    member = MemberDescription("m-1", "worker-1", "/10.0.0.7",
                               MemberAssignment([TopicPartition(topic, 0), TopicPartition(topic, 1)]))
    live = ConsumerGroupDescription(hit, False, [member], "range", ConsumerGroupState.STABLE, Node(1, "h", 1))
    admin = FailingAdmin(admin_client(kafka_bootstrap), offset_fetch={hit}, description={hit: live})
    rows = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))[hit]
    assert [(r["topic"], r["partition"], r["log_end_offset"], r["committed_offset"], r["lag"], r["client_id"])
            for r in rows] == [(topic, 0, 5, None, None, "worker-1"), (topic, 1, 5, None, None, "worker-1")]
    assert {r["read_error"] for r in rows} == {
        "committed offsets: Broker: Coordinator load in progress (COORDINATOR_LOAD_IN_PROGRESS)"}
    assert {(r["group_state"], r["group_members"]) for r in rows} == {("STABLE", 1)}


def test_failed_end_offset_read_keeps_the_row_with_the_offsets_unknown(kafka_bootstrap, lagging):
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), end_offsets={(topic, 1)})
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap)
    assert table.schema.field("log_end_offset").nullable  # null, beside a read_error, only where a read failed
    groups = by_group(table)
    for group, committed in ((hit, 5), (calm, 1)):
        p0, p1 = groups[group]
        assert p0["read_error"] is None and p0["log_end_offset"] == 5
        assert (p1["partition"], p1["log_start_offset"], p1["log_end_offset"], p1["committed_offset"], p1["lag"]) == (
            1, 0, None, committed, None)
        assert p1["read_error"] == "log end offset: Local: Timed out (_TIMED_OUT)"


def test_a_leader_that_moved_is_asked_again_and_the_row_is_complete(kafka_bootstrap, lagging):
    """A rolling restart: the partition's old leader answers NOT_LEADER_FOR_PARTITION to its three
    ListOffsets reads. Seen at 10,000 groups x 20 partitions: 1,120 rows read as failed and 990
    groups said "incomplete data". Asked once more, the new leader answers."""
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), leader_moves={(topic, 1): 3})
    groups = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))
    for group, committed in ((hit, 5), (calm, 1)):
        p0, p1 = groups[group]
        assert (p1["log_start_offset"], p1["log_end_offset"], p1["committed_offset"], p1["read_error"]) == (
            0, 5, committed, None)


def test_a_leader_still_moving_after_the_retry_is_a_read_error_that_says_so(kafka_bootstrap, lagging):
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), leader_moves={(topic, 1): 6})
    p0, p1 = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))[hit]
    assert p0["read_error"] is None and p0["log_end_offset"] == 5
    assert (p1["log_end_offset"], p1["lag"]) == (None, None)  # unknown, never 0
    assert p1["read_error"] == ("log start offset: Broker: Not leader for partition (NOT_LEADER_FOR_PARTITION) "
                                "(and again after a retry); log end offset: Broker: Not leader for partition "
                                "(NOT_LEADER_FOR_PARTITION) (and again after a retry)")


def test_failed_describe_is_state_unknown_with_offsets_still_read(kafka_bootstrap, lagging):
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), describe={hit})
    rows = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))[hit]
    assert [(r["partition"], r["group_state"], r["group_members"], r["lag"]) for r in rows] == [
        (0, "UNKNOWN", None, 3), (1, "UNKNOWN", None, 0)]
    assert {r["read_error"] for r in rows} == {
        "group description: Broker: Group authorization failed (GROUP_AUTHORIZATION_FAILED)"}



# -- a listing that leaves groups out with no error ------------------------------
# A broker's ListGroups answer leaves out the groups of a coordinator partition that is
# moving (Kafka turns NOT_COORDINATOR into an empty answer): seen in a rolling restart,
# a snapshot 23 groups short with nothing to say so. The race cannot be scheduled on a
# broker, so FailingAdmin drops the groups from the real listing.

def _lags(rows):
    return [(r["partition"], r["committed_offset"], r["lag"], r["read_error"]) for r in rows]


def test_a_group_listed_before_and_left_out_now_is_read_directly_and_a_deleted_one_drops(
        kafka_bootstrap, lagging, unique):
    topic, hit, calm, pattern = lagging
    gone = unique("gone")
    commit_offsets(kafka_bootstrap, gone, topic, {0: 1})
    pattern = f"{pattern}|{re.escape(gone)}"
    admin = FailingAdmin(admin_client(kafka_bootstrap))
    assert set(by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))) == {hit, calm, gone}

    admin.delete_consumer_groups([gone], request_timeout=10)[gone].result()
    admin.unlisted = {hit, gone}
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap)
    got = by_group(table)
    # The group that exists is there with what its coordinator says; the deleted one is gone, no error row.
    assert set(got) == {hit, calm}
    assert undiagnosed_groups(table) == []


def test_a_consumer_group_only_listgroups_lists_is_read_not_counted_a_share_group(kafka_bootstrap, lagging):
    """A fresh client: ListConsumerGroups missed `hit`, ListGroups (sent just after) lists it, EMPTY."""
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), unlisted={hit}, only_consumer_listing=True)
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap)
    got = by_group(table)
    assert set(got) == {hit, calm}
    assert _lags(got[hit]) == [(0, 2, 3, None), (1, 5, 0, None)]
    assert undiagnosed_groups(table) == []
    assert _lags(got[hit]) == [(0, 2, 3, None), (1, 5, 0, None)]
    assert {r["group_state"] for r in got[hit]} == {"EMPTY"}


def test_coordinators_that_moved_during_the_listing_are_listed_again(kafka_bootstrap, lagging):
    """A fresh client (nothing listed before): the first metadata answer names another
    coordinator than the one read after the listing, which missed `hit`."""
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), unlisted={hit}, unlisted_listings=1, coordinator_moves=1)
    got = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))
    assert set(got) == {hit, calm}
    assert _lags(got[hit]) == [(0, 2, 3, None), (1, 5, 0, None)]


@pytest.mark.parametrize("fault, says", [
    ({"coordinator_moves": 3}, "group listing: the group coordinators moved while the groups were listed"),
    ({"leaderless": True}, "group listing: __consumer_offsets partitions [0] have no leader"),
])
def test_a_listing_that_may_have_missed_groups_says_so(kafka_bootstrap, lagging, fault, says):
    topic, hit, calm, pattern = lagging
    admin = FailingAdmin(admin_client(kafka_bootstrap), unlisted={hit}, **fault)
    got = by_group(collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap))
    assert set(got) == {"", calm}
    (row,) = got[""]
    assert row["read_error"].startswith(says), row["read_error"]
    assert (row["topic"], row["partition"], row["lag"]) == ("", -1, None)


# -- retried runs and a broker that dies -------------------------------------------


def _files(root: Path) -> dict[str, bytes]:
    """Every file under the store, hidden and temporary ones included, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def kafka_env(monkeypatch):
    """take_snapshots reads `kafka_default`; without that connection it uses KAFKA_BOOTSTRAP_SERVERS."""
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)

    def point_at(bootstrap: str) -> None:
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)

    return point_at


def test_a_rerun_of_the_same_run_samples_only_what_is_missing(kafka_bootstrap, lagging, kafka_env, tmp_path):
    topic, hit, calm, pattern = lagging
    kafka_env(kafka_bootstrap)
    settings = Settings(data_root=str(tmp_path))
    root = Path(settings.snapshots_root)

    def run():
        return take_snapshots("kafka_default", "scheduled__2026-11-21T03:15:00+00:00",
                                            group_pattern=pattern, samples=3, interval_s=0, settings=settings)

    first = run()
    files = _files(root)
    assert (first["files"], len(files)) == (3, 3)

    again = run()  # a retry after everything was written: nothing is sampled again
    assert (again["files"], again["already_written"]) == (0, 3)
    assert _files(root) == files

    second = next(name for name in files if name.endswith("-1.parquet"))
    (root / second).unlink()
    resumed = run()
    assert (resumed["files"], resumed["already_written"]) == (1, 2)
    now = _files(root)
    # Samples 1 and 3 are the very same files; sample 2 is new (its own time) under the same key.
    assert {k: v for k, v in now.items() if not k.endswith("-1.parquet")} == {
        k: v for k, v in files.items() if not k.endswith("-1.parquet")}
    (new_second,) = [k for k in now if k.endswith("-1.parquet")]
    assert new_second != second and new_second.rsplit("-", 2)[-2:] == second.rsplit("-", 2)[-2:]


def test_broker_killed_between_samples(kafka_env, tmp_path, monkeypatch, unique, capfd):
    from lagdoctor.kafka.broker import EmbeddedBroker

    settings = Settings(data_root=str(tmp_path))
    root = Path(settings.snapshots_root)
    broker = EmbeddedBroker().start()
    try:
        topic, group = unique("doomed"), unique("doomed-group")
        create_topic(broker.bootstrap, topic, 2)
        produce_counts(broker.bootstrap, topic, {0: 4, 1: 6})
        commit_offsets(broker.bootstrap, group, topic, {0: 1, 1: 6})
        kafka_env(broker.bootstrap)

        real_write = store.write_snapshot

        def write_then_kill_the_broker(*args, **kwargs):
            path = real_write(*args, **kwargs)
            # Killed from another thread, as a crash would, while the task sleeps between samples.
            killer = threading.Thread(target=broker.kill_node, args=(1,))
            killer.start()
            killer.join()
            return path

        monkeypatch.setattr(store, "write_snapshot", write_then_kill_the_broker)

        def run():
            return take_snapshots("kafka_default", "manual__outage", group_pattern=re.escape(group),
                                                samples=3, interval_s=0, settings=settings)

        with pytest.raises(CollectionError) as first:
            run()
        message = str(first.value)
        assert "\n" not in message and message.startswith(f"cannot reach Kafka at {broker.bootstrap}:")

        # The first sample is intact and readable; nothing partial or hidden is left.
        files = _files(root)
        assert len(files) == 1 and all(not Path(f).name.startswith(".") for f in files)
        rows = store.read_snapshots(str(root)).to_pylist()
        assert sorted((r["partition"], r["lag"], r["read_error"]) for r in rows) == [(0, 3, None), (1, 0, None)]

        # A retry while the broker is still down fails with the same line and writes nothing.
        with pytest.raises(CollectionError) as retry:
            run()
        assert str(retry.value).startswith(f"cannot reach Kafka at {broker.bootstrap}:")
        assert "\n" not in str(retry.value)
        assert _files(root) == files

        # The broker comes back with its data: the next retry keeps the first sample and adds the rest.
        monkeypatch.setattr(store, "write_snapshot", real_write)
        broker.start_node(1)
        resumed = run()
        assert (resumed["files"], resumed["already_written"]) == (2, 1)
        rows = store.read_snapshots(str(root)).to_pylist()
        assert len(_files(root)) == 3 and len(rows) == 6
        assert {(r["partition"], r["lag"], r["read_error"]) for r in rows} == {(0, 3, None), (1, 0, None)}
    finally:
        broker.stop()
    # librdkafka's own lines (%3|FAIL|...) went to the debug logger, not to stderr.
    assert "%3|" not in capfd.readouterr().err


def test_airflow_connection_client_says_cannot_authenticate_and_keeps_stderr_clean(
        kafka_bootstrap, embedded_only, monkeypatch, capfd):
    """The client built from an Airflow `kafka` connection (the provider hook's) is routed
    like the CLI's: one line saying authentication failed, no librdkafka lines on stderr."""
    import json

    from lagdoctor.kafka.clients import airflow_admin_client

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SASL", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": kafka_bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "lagdoctor", "sasl.password": "hunter2-not-to-be-printed"}}))
    admin = airflow_admin_client("kafka_sasl")
    with pytest.raises(CollectionError) as err:
        collect_snapshot(admin, "kafka_sasl", None, NOW, bootstrap=kafka_bootstrap)
    assert str(err.value).startswith(f"cannot authenticate to Kafka at {kafka_bootstrap}: ")
    assert "\n" not in str(err.value) and "hunter2" not in str(err.value)
    assert "%3|" not in capfd.readouterr().err


# -- many requests in flight: a bounded window, a read budget --------------------------


class CountingAdmin:
    """The real AdminClient, counting the group and ListOffsets requests outstanding at once."""

    def __init__(self, admin):
        import threading

        self._admin, self._lock = admin, threading.Lock()
        self.outstanding = self.most = self.calls = 0

    def __getattr__(self, name):
        return getattr(self._admin, name)

    def _count(self, futures, requests):
        with self._lock:
            self.outstanding += requests
            self.most = max(self.most, self.outstanding)
            self.calls += 1
        left = [len(futures)]

        def done(_):
            with self._lock:
                left[0] -= 1
                if left[0] == 0:
                    self.outstanding -= requests

        for fut in futures.values():
            fut.add_done_callback(done)
        return futures

    def describe_consumer_groups(self, group_ids, **kwargs):
        return self._count(self._admin.describe_consumer_groups(group_ids, **kwargs), len(group_ids))

    def list_consumer_group_offsets(self, requests, **kwargs):
        return self._count(self._admin.list_consumer_group_offsets(requests, **kwargs), 1)

    def list_offsets(self, request, **kwargs):
        return self._count(self._admin.list_offsets(request, **kwargs), 1)


@pytest.fixture
def six_groups(kafka_bootstrap, unique):
    """A 5-partition topic (4 records each) and six EMPTY groups committed at 0..5 on every partition."""
    topic = unique("wide")
    create_topic(kafka_bootstrap, topic, 5)
    produce_counts(kafka_bootstrap, topic, {p: 4 for p in range(5)})
    groups = [unique(f"g{i}") for i in range(6)]
    for i, group in enumerate(groups):
        commit_offsets(kafka_bootstrap, group, topic, {p: min(i, 4) for p in range(5)})
    return topic, groups, "|".join(re.escape(g) for g in groups)


def test_one_failed_request_among_many_in_flight_marks_exactly_its_group(kafka_bootstrap, six_groups, monkeypatch):
    from lagdoctor.kafka import log_offsets

    topic, groups, pattern = six_groups
    # ListOffsets in calls of 2 partitions: a topic's partitions span three calls.
    monkeypatch.setattr(log_offsets, "LIST_OFFSETS_BATCH", 2)
    admin = FailingAdmin(admin_client(kafka_bootstrap), offset_fetch={groups[1], groups[4]}, describe={groups[2]},
                         end_offsets={(topic, 3)})
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap, max_in_flight=2)
    got = by_group(table)
    assert set(got) == set(groups)  # none vanished
    for failed in (groups[1], groups[4]):
        (row,) = got[failed]
        assert (row["topic"], row["partition"], row["committed_offset"], row["lag"]) == ("", -1, None, None)
        assert row["read_error"].startswith("committed offsets: Broker: Coordinator load in progress")
    assert {r["read_error"] for r in got[groups[2]] if r["partition"] != 3} == {
        "group description: Broker: Group authorization failed (GROUP_AUTHORIZATION_FAILED)"}
    for i in (0, 2, 3, 5):
        rows = got[groups[i]]
        assert [r["partition"] for r in rows] == [0, 1, 2, 3, 4]
        assert [r["committed_offset"] for r in rows] == [min(i, 4)] * 5
        # every partition's end offset read, across the ListOffsets calls, but partition 3's
        assert [r["lag"] for r in rows] == [4 - min(i, 4)] * 3 + [None, 4 - min(i, 4)]
        assert rows[3]["read_error"].endswith("log end offset: Local: Timed out (_TIMED_OUT)")
        if i != 2:
            assert [r["read_error"] for r in rows if r["partition"] != 3] == [None] * 4
            assert {r["group_state"] for r in rows} == {"EMPTY"}


@pytest.mark.parametrize("limit", [1, 3])
def test_requests_in_flight_never_exceed_the_window(kafka_bootstrap, six_groups, limit):
    topic, groups, pattern = six_groups
    admin = CountingAdmin(admin_client(kafka_bootstrap))
    table = collect_snapshot(admin, "prod", pattern, NOW, bootstrap=kafka_bootstrap, max_in_flight=limit)
    assert table.num_rows == 30 and table.column("read_error").null_count == 30
    # 6 offset fetches, describes in calls of one group, three ListOffsets calls
    # (earliest, latest, latest READ_COMMITTED for the last stable offset)
    assert admin.calls == 6 + 6 + 3
    assert 1 <= admin.most <= limit


def test_reads_not_started_within_the_budget_are_read_errors(kafka_bootstrap, six_groups):
    topic, groups, pattern = six_groups
    table = collect_snapshot(admin_client(kafka_bootstrap), "prod", pattern, NOW, bootstrap=kafka_bootstrap,
                             read_budget_s=0)
    got = by_group(table)
    assert set(got) == set(groups)  # kept, one group row each: their topics are unknown
    budget = "not read: the snapshot's 0 s read budget ran out first"
    for group in groups:
        (row,) = got[group]
        assert (row["topic"], row["partition"], row["group_state"], row["group_members"], row["lag"]) == (
            "", -1, "UNKNOWN", None, None)
        assert row["read_error"] == f"group description: {budget}; committed offsets: {budget}"


def test_a_broker_that_dies_mid_snapshot_costs_the_budget_not_a_timeout_per_group(unique):
    """Six groups read one at a time against a broker killed right after the group
    listing: without the budget, twelve timeouts in a row; with it, the budget plus one."""
    import time
    from concurrent.futures import Future

    from lagdoctor.kafka.broker import EmbeddedBroker

    broker = EmbeddedBroker().start()
    try:
        topic = unique("dying")
        create_topic(broker.bootstrap, topic, 2)
        groups = [unique(f"d{i}") for i in range(6)]
        for group in groups:
            commit_offsets(broker.bootstrap, group, topic, {0: 0, 1: 0})
        real = admin_client(broker.bootstrap)

        class KilledAfterListing:
            def __getattr__(self, name):
                return getattr(real, name)

            def list_consumer_groups(self, **kwargs):
                listed = real.list_consumer_groups(**kwargs).result()
                broker.stop()
                stopped.append(time.monotonic())
                fut = Future()
                fut.set_result(listed)
                return fut

        stopped: list[float] = []
        table = collect_snapshot(KilledAfterListing(), "prod", "|".join(map(re.escape, groups)), NOW,
                                 bootstrap=broker.bootstrap, timeout_s=2, read_budget_s=3, max_in_flight=1)
        took = time.monotonic() - stopped[0]
    finally:
        broker.stop()
    got = by_group(table)
    assert set(got) == set(groups) and all(len(rows) == 1 and rows[0]["read_error"] for rows in got.values())
    # One at a time, every group's two reads would time out in turn: 6 x 2 x 2 s. The budget
    # (3 s) plus one timeout (2 s), with 3 s to spare for a busy 2-core machine.
    assert took < 3 + 2 + 3, f"took {took:.1f} s after the broker died"
    assert any("read budget ran out" in rows[0]["read_error"] for rows in got.values())


def test_groups_that_ran_the_budget_out_still_get_their_log_end_offsets(kafka_bootstrap, six_groups):
    """Slow group reads spend the snapshot's budget: the groups that were read still get
    their partitions' end offsets (their own budget), so their lag is known, not blank."""
    import time

    topic, groups, pattern = six_groups
    real = admin_client(kafka_bootstrap)

    class SlowOffsetFetch:
        def __getattr__(self, name):
            return getattr(real, name)

        def list_consumer_group_offsets(self, *args, **kwargs):
            futures = real.list_consumer_group_offsets(*args, **kwargs)
            time.sleep(0.6)
            return futures

    table = collect_snapshot(SlowOffsetFetch(), "prod", pattern, NOW, bootstrap=kafka_bootstrap,
                             read_budget_s=1.0, max_in_flight=1)
    got = by_group(table)
    read = [g for g in groups if got[g][0]["partition"] != -1]
    unread = [g for g in groups if got[g][0]["partition"] == -1]
    assert read and unread  # the budget ran out part way
    for group in read:
        assert all(r["log_end_offset"] is not None and r["lag"] is not None for r in got[group]), got[group]
    assert all("read budget ran out" in got[g][0]["read_error"] for g in unread)
