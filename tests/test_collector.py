"""collect_snapshot against a real Kafka-protocol broker (the embedded Apache Kafka, or KAFKA_BOOTSTRAP_SERVERS),
and the two pure rules it applies: group state names and group patterns."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime, timezone

import pytest
from confluent_kafka import ConsumerGroupState

from lagdoctor.kafka.collector import collect_snapshot, compile_group_pattern, group_state_name
from lagdoctor.contracts import GROUP_STATES
from lagdoctor.kafka.clients import admin_client
from lagdoctor.kafka.request_window import RequestWindow
from lagdoctor.lab.workload import commit_offsets, create_topic, live_consumer_config, produce_counts

broker = pytest.mark.broker

NOW = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)


def rows_by_key(table):
    return {(r["group_id"], r["topic"], r["partition"]): r for r in table.to_pylist()}


@pytest.fixture(scope="module")
def workload(kafka_bootstrap):
    """A topic with 3 partitions of 10/20/5 records and groups in known states."""
    suffix = f"{os.getpid()}-{int(time.time())}"
    names = {
        "topic": f"orders-{suffix}",
        "full": f"billing-{suffix}",
        "partial": f"audit-{suffix}",
        "above": f"racy-{suffix}",
    }
    create_topic(kafka_bootstrap, names["topic"], 3)
    produce_counts(kafka_bootstrap, names["topic"], {0: 10, 1: 20, 2: 5})
    commit_offsets(kafka_bootstrap, names["full"], names["topic"], {0: 10, 1: 5, 2: 5})
    commit_offsets(kafka_bootstrap, names["partial"], names["topic"], {0: 3})
    # A commit above the end offset: what a race between the two reads looks like.
    commit_offsets(kafka_bootstrap, names["above"], names["topic"], {0: 12, 1: 20, 2: 5})
    pattern = "|".join(re.escape(names[k]) for k in ("full", "partial", "above"))
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", pattern, NOW, bootstrap=kafka_bootstrap)
    return names, table


@broker
def test_committed_group_has_exact_offsets_and_lag(workload):
    names, table = workload
    rows = rows_by_key(table)
    got = {p: (rows[(names["full"], names["topic"], p)]["committed_offset"],
               rows[(names["full"], names["topic"], p)]["log_end_offset"],
               rows[(names["full"], names["topic"], p)]["lag"]) for p in range(3)}
    assert got == {0: (10, 10, 0), 1: (5, 20, 15), 2: (5, 5, 0)}


@broker
def test_partial_commit_gives_null_offsets_for_uncommitted_partitions(workload):
    names, table = workload
    rows = rows_by_key(table)
    assert rows[(names["partial"], names["topic"], 0)]["lag"] == 7
    for p in (1, 2):
        row = rows[(names["partial"], names["topic"], p)]
        assert row["committed_offset"] is None and row["lag"] is None
        # The partition is still reported with its log end offset: data waits there.
        assert row["log_end_offset"] == {1: 20, 2: 5}[p]


@broker
def test_commit_above_end_offset_is_lag_zero(workload):
    names, table = workload
    row = rows_by_key(table)[(names["above"], names["topic"], 0)]
    assert (row["committed_offset"], row["log_end_offset"], row["lag"]) == (12, 10, 0)


@broker
def test_empty_group_has_zero_members_and_no_owner(workload):
    names, table = workload
    for row in table.to_pylist():
        assert row["group_state"] == "EMPTY"
        assert row["group_members"] == 0
        assert row["member_id"] is None and row["host"] is None and row["client_id"] is None


@broker
def test_snapshot_metadata_columns(workload):
    names, table = workload
    rows = table.to_pylist()
    assert len(rows) == 9  # 3 groups x 3 partitions
    assert {r["cluster"] for r in rows} == {"local"}
    assert {r["snapshot_ts"] for r in rows} == {NOW}
    assert all(r["log_start_offset"] == 0 for r in rows)
    assert {r["read_error"] for r in rows} == {None}  # every read succeeded
    # ...so the file carries contract 1's schema to the letter: the log offsets are not null
    assert not table.schema.field("log_end_offset").nullable and not table.schema.field("log_start_offset").nullable


@broker
def test_pattern_matching_nothing_is_an_empty_snapshot(kafka_bootstrap):
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", "no-such-group-.*", NOW)
    assert table.num_rows == 0
    assert "committed_offset" in table.column_names


@broker
def test_pattern_is_matched_in_full(kafka_bootstrap, workload):
    names, _ = workload
    # A prefix of a group id is not a match.
    table = collect_snapshot(admin_client(kafka_bootstrap), "local", names["full"][:-2], NOW)
    assert table.num_rows == 0


@broker
def test_deleted_topic_rows_are_dropped_and_other_topics_kept(kafka_bootstrap, unique):
    kept, doomed, group = unique("kept"), unique("doomed"), unique("mixed")
    for topic in (kept, doomed):
        create_topic(kafka_bootstrap, topic, 2)
        produce_counts(kafka_bootstrap, topic, {0: 4, 1: 4})
        commit_offsets(kafka_bootstrap, group, topic, {0: 1, 1: 2})
    admin = admin_client(kafka_bootstrap)
    for _, fut in admin.delete_topics([doomed]).items():
        fut.result()
    deadline = time.monotonic() + 10
    while doomed in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    table = collect_snapshot(admin, "local", re.escape(group), NOW)
    assert {r["topic"] for r in table.to_pylist()} == {kept}
    assert sorted(r["lag"] for r in table.to_pylist()) == [2, 3]


@broker
def test_commit_below_log_start_keeps_the_row(kafka_bootstrap, unique):
    from confluent_kafka import TopicPartition

    topic, group = unique("retained"), unique("slowpoke")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 10})
    commit_offsets(kafka_bootstrap, group, topic, {0: 2})
    admin = admin_client(kafka_bootstrap)
    # retention (here DeleteRecords) removed offsets 0-5, four of them unread by the group
    for fut in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        fut.result(timeout=30)
    (row,) = collect_snapshot(admin, "local", re.escape(group), NOW).to_pylist()
    assert (row["log_start_offset"], row["committed_offset"], row["lag"]) == (6, 2, 8)


@broker
def test_live_group_owner_and_membership(kafka_bootstrap, unique):
    from confluent_kafka import Consumer

    topic, group = unique("live"), unique("live-group")
    create_topic(kafka_bootstrap, topic, 2)
    produce_counts(kafka_bootstrap, topic, {0: 3, 1: 3})
    consumer = Consumer(live_consumer_config(kafka_bootstrap, group, "worker-1"))
    try:
        consumer.subscribe([topic])
        seen, deadline = 0, time.monotonic() + 30
        while seen < 6 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                seen += 1
                consumer.commit(msg, asynchronous=False)
        assert seen == 6, "the live consumer never got its records"
        rows = collect_snapshot(admin_client(kafka_bootstrap), "local", re.escape(group), NOW).to_pylist()
    finally:
        consumer.close()
    assert [r["lag"] for r in rows] == [0, 0]
    assert {r["group_state"] for r in rows} == {"STABLE"}
    # The owner, as kafka-consumer-groups.sh --describe names it: member, client and host.
    assert {r["group_members"] for r in rows} == {1}
    assert {r["client_id"] for r in rows} == {"worker-1"}
    assert len({r["member_id"] for r in rows}) == 1 and rows[0]["member_id"]
    assert {r["host"] for r in rows} == {"/127.0.0.1"}


# -- group states and group patterns (no broker) ------------------------------------


@pytest.mark.parametrize(
    "reported, expected",
    [
        # Every ConsumerGroupState confluent-kafka 2.16.1 defines (its names end in -ING).
        *[(state, {"UNKNOWN": "UNKNOWN", "PREPARING_REBALANCING": "PREPARING_REBALANCE",
                   "COMPLETING_REBALANCING": "COMPLETING_REBALANCE", "STABLE": "STABLE", "DEAD": "DEAD",
                   "EMPTY": "EMPTY"}[state.name]) for state in ConsumerGroupState],
        # Kafka's own spellings, KIP-848 consumer groups' ASSIGNING/RECONCILING included: a
        # client that passes them through must not turn a live state into UNKNOWN.
        ("PreparingRebalance", "PREPARING_REBALANCE"),
        ("CompletingRebalance", "COMPLETING_REBALANCE"),
        ("Assigning", "ASSIGNING"),
        ("Reconciling", "RECONCILING"),
        ("Stable", "STABLE"),
        # Contract 1's names map to themselves.
        *[(name, name) for name in GROUP_STATES],
        # Only what nobody can name is UNKNOWN.
        (None, "UNKNOWN"),
        ("Rebooting", "UNKNOWN"),
    ],
)
def test_group_states_map_to_contract_names(reported, expected):
    assert group_state_name(reported) == expected


def _kip848_description(state, type_name, members):
    """A DescribeConsumerGroups answer; members are (assigned, target) partition lists of topic "t"."""
    from concurrent.futures import Future

    from confluent_kafka import ConsumerGroupType, Node, TopicPartition
    from confluent_kafka.admin import ConsumerGroupDescription, MemberAssignment, MemberDescription

    def assignment(parts):
        return MemberAssignment([TopicPartition("t", p) for p in parts])

    described = [MemberDescription(f"m{i}", f"c{i}", "/10.0.0.1", assignment(mine), target_assignment=assignment(target))
                 for i, (mine, target) in enumerate(members)]
    fut: Future = Future()
    fut.set_result(ConsumerGroupDescription("g", False, described, "uniform", state, Node(1, "127.0.0.1", 9092),
                                            type=ConsumerGroupType[type_name]))
    return fut


@pytest.mark.parametrize(
    "state, type_name, members, expected",
    [
        # confluent-kafka 2.16 says UNKNOWN for a KIP-848 group's Assigning and Reconciling.
        # A member that does not hold its target yet: reconciling (a newcomer waiting for partitions).
        (ConsumerGroupState.UNKNOWN, "CONSUMER", [([0, 1], [0]), ([], [1])], "RECONCILING"),
        # Every member holds its target, but the state has no name: the coordinator has not
        # computed the new target (a member just left; its partitions have no owner yet).
        (ConsumerGroupState.UNKNOWN, "CONSUMER", [([0], [0]), ([1], [1])], "ASSIGNING"),
        # Named states pass through, whatever the members hold.
        (ConsumerGroupState.STABLE, "CONSUMER", [([0], [0, 1])], "STABLE"),
        # A classic group's UNKNOWN is a state nobody named: it stays UNKNOWN.
        (ConsumerGroupState.UNKNOWN, "CLASSIC", [([0], [0])], "UNKNOWN"),
    ],
)
def test_a_kip848_group_without_a_state_name_is_assigning_or_reconciling(state, type_name, members, expected):
    from lagdoctor.kafka.group_reads import _description

    assert _description("g", _kip848_description(state, type_name, members)).state == expected


def test_catastrophic_pattern_matches_in_linear_time():
    # With backtracking, (a+)+$ took 160 s per sample against a 31-character group id
    # that almost matches; RE2 answers at once (the suite's timeout would catch a hang).
    pattern = compile_group_pattern("(a+)+$")
    assert pattern.fullmatch("a" * 31) is not None
    assert pattern.fullmatch("a" * 30 + "!") is None


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("orders-[", "invalid --groups regex 'orders-[': missing ]: ["),
        (r"(a)\1",
         r"invalid --groups regex '(a)\\1': invalid escape sequence: \1 (RE2 syntax: no backreferences or lookaround)"),
        ("(?=orders)o.*", "invalid --groups regex '(?=orders)o.*': invalid perl operator: (?= (RE2 syntax"),
        ("a" * 1001, "invalid --groups regex '" + "a" * 57 + "...': 1001 characters, at most 1000"),
    ],
)
def test_bad_group_patterns_fail_with_one_line_naming_the_problem(pattern, message):
    with pytest.raises(ValueError) as err:
        compile_group_pattern(pattern, what="--groups")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("pattern, group, matches", [
    (None, "anything", True),
    ("", "anything", True),
    ("orders-.*", "orders-eu", True),
    ("orders-.*", "legacy-orders-eu", False),  # matched in full, not searched
    ("orders", "orders-eu", False),
])
def test_group_pattern_matches_the_whole_id(pattern, group, matches):
    assert (compile_group_pattern(pattern).fullmatch(group) is not None) is matches


# -- group reads in a child process (librdkafka crashes during broker restarts) --

def test_group_reads_run_apart_for_a_client_built_here_and_in_process_for_any_other():
    from lagdoctor.kafka import group_reads

    reader = group_reads.group_reader(admin_client("127.0.0.1:1"))
    assert isinstance(reader, group_reads.IsolatedReader)
    other = object()
    assert group_reads.group_reader(other) is other
    # A config a child cannot be sent (a closure callback) keeps the reads here, on a new client.
    closure = admin_client("127.0.0.1:1", {"oauth_cb": lambda config: ("token", 2e9), "security.protocol":
                                           "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER"})
    assert not isinstance(group_reads.group_reader(closure), group_reads.IsolatedReader)
    # The parent's statistics hook is its own: not sent, so the reads still run apart.
    counted = admin_client("127.0.0.1:1", {"stats_cb": lambda stats: None, "statistics.interval.ms": 1000})
    assert isinstance(group_reads.group_reader(counted), group_reads.IsolatedReader)


def _refresh_token(config):
    return "token", 2e9


def test_a_callback_a_script_defines_keeps_the_group_reads_in_its_process(monkeypatch):
    """A callback defined in the script being run pickles (the parent finds it in __main__)
    but the child, another __main__, cannot load it: every group read would fail."""
    import sys

    from lagdoctor.kafka import group_reads

    config = {"bootstrap.servers": "127.0.0.1:1", "oauth_cb": _refresh_token}
    assert group_reads.IsolatedReader.of(config) is not None  # importable from its module: sent
    monkeypatch.setattr(_refresh_token, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "_refresh_token", _refresh_token, raising=False)
    assert group_reads.IsolatedReader.of(config) is None


def test_a_group_reader_that_crashes_gives_read_errors_not_a_dead_process(monkeypatch):
    """The child's Kafka client dies of SIGSEGV (librdkafka issue 5040), twice: every group's
    reads are read errors saying so, the snapshot's process lives on."""
    from lagdoctor.kafka import group_reads

    monkeypatch.setattr(group_reads, "_CHILD_MAIN", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    reader = group_reads.group_reader(admin_client("127.0.0.1:1"))
    described, commits = group_reads.read_groups(reader, ["a", "b"], 1.0, RequestWindow(8, 30))
    assert set(described) == set(commits) == {"a", "b"}
    for group in ("a", "b"):
        assert described[group].state == "UNKNOWN" and described[group].members is None
        assert "crashed (SIGSEGV)" in described[group].error and "\n" not in described[group].error
        assert commits[group].error.startswith("committed offsets: not read: the Kafka client crashed (SIGSEGV)")
        assert not commits[group].commits


def test_a_group_reader_answers_through_the_child(monkeypatch):
    """No groups: no child; a child's KafkaException comes back as one (collect_snapshot's CollectionError)."""
    from confluent_kafka import KafkaException

    from lagdoctor.kafka import group_reads

    reader = group_reads.group_reader(admin_client("127.0.0.1:1"))
    assert group_reads.read_groups(reader, [], 1.0, RequestWindow(8, 30)) == ({}, {})
    monkeypatch.setattr(group_reads, "_CHILD_MAIN", (
        "import pickle, sys; sys.stdin.buffer.read(); "
        "sys.stdout.buffer.write(pickle.dumps(('kafka', 'Local: Broker transport failure')))"))
    with pytest.raises(KafkaException, match="Broker transport failure"):
        group_reads.read_groups(reader, ["a"], 1.0, RequestWindow(8, 30))
