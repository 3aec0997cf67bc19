"""Offset collection: one snapshot of every matching group's offsets (contract 1).

The collector only reads and records; it never decides anything about lag.
It uses the AdminClient's batched calls so the number of broker requests grows
with groups and brokers, never with partitions:

    1  Metadata (all topics, partitions and leaders)
    1  ListConsumerGroups (per broker, done by librdkafka)
    1  DescribeConsumerGroups for all matching groups (futures map)
    G  ListConsumerGroupOffsets, one per group (the API takes one group per
       request), all in flight at once
    2  ListOffsets, earliest and latest, each for every partition at once
       (librdkafka fans each out per partition leader)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from lagdoctor.contracts import snapshot_arrow_schema

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0

# confluent-kafka's ConsumerGroupState names -> contract 1's upper snake case.
_STATE_NAMES = {
    "STABLE": "STABLE",
    "PREPARING_REBALANCING": "PREPARING_REBALANCE",
    "PREPARING_REBALANCE": "PREPARING_REBALANCE",
    "COMPLETING_REBALANCING": "COMPLETING_REBALANCE",
    "COMPLETING_REBALANCE": "COMPLETING_REBALANCE",
    "EMPTY": "EMPTY",
    "DEAD": "DEAD",
    "ASSIGNING": "ASSIGNING",
    "RECONCILING": "RECONCILING",
}
_NO_MEMBER_STATES = frozenset({"EMPTY", "DEAD"})


class CollectionError(RuntimeError):
    """The cluster could not be read; the message is one line, safe to print."""


@dataclass(frozen=True)
class Owner:
    member_id: str
    client_id: str
    host: str


@dataclass(frozen=True)
class GroupView:
    group_id: str
    state: str
    members: int | None
    owners: Mapping[tuple[str, int], Owner]
    committed: Mapping[tuple[str, int], int | None]


def group_state_name(state: Any) -> str:
    """Contract 1 state name for a confluent-kafka ConsumerGroupState (or None)."""
    name = getattr(state, "name", None) or (str(state) if state is not None else "")
    return _STATE_NAMES.get(name.upper(), "UNKNOWN")


def compile_group_pattern(pattern: str | None) -> re.Pattern[str]:
    """Group ids are matched in full: `orders-.*` matches orders-eu, not legacy-orders-eu."""
    try:
        return re.compile(pattern or ".*")
    except re.error as exc:
        raise ValueError(f"invalid --groups regex {pattern!r}: {exc}") from None


def _one_line(exc: BaseException) -> str:
    first = exc.args[0] if getattr(exc, "args", None) else exc
    # KafkaException wraps a KafkaError whose str() is the readable part.
    text = first.str() if hasattr(first, "str") else str(first)
    return " ".join(text.split())


def list_group_ids(admin: Any, pattern: re.Pattern[str], timeout_s: float) -> list[str]:
    result = admin.list_consumer_groups(request_timeout=timeout_s).result()
    for err in getattr(result, "errors", None) or []:
        log.warning("listing consumer groups on one broker failed: %s", _one_line(err))
    return sorted({g.group_id for g in result.valid if pattern.fullmatch(g.group_id)})


def describe_groups(
    admin: Any, group_ids: list[str], timeout_s: float
) -> dict[str, tuple[str, int | None, dict[tuple[str, int], Owner]]]:
    """State, member count and partition owners per group, in one batched call."""
    described: dict[str, tuple[str, int | None, dict[tuple[str, int], Owner]]] = {}
    if not group_ids:
        return described
    for group_id, fut in admin.describe_consumer_groups(group_ids, request_timeout=timeout_s).items():
        try:
            desc = fut.result()
        except Exception as exc:  # e.g. missing DESCRIBE rights on one group
            log.warning("describing group %s failed: %s", group_id, _one_line(exc))
            described[group_id] = ("UNKNOWN", None, {})
            continue
        state = group_state_name(desc.state)
        members = list(desc.members or [])
        owners: dict[tuple[str, int], Owner] = {}
        for m in members:
            for tp in getattr(m.assignment, "topic_partitions", None) or []:
                owners[(tp.topic, tp.partition)] = Owner(m.member_id, m.client_id, m.host)
        # An active state with no member list means membership unknown (Tansu,
        # or no DESCRIBE rights), which is not the same as zero members.
        count = len(members) if members or state in _NO_MEMBER_STATES else None
        described[group_id] = (state, count, owners)
    return described


def committed_offsets(
    admin: Any, group_ids: list[str], timeout_s: float
) -> dict[str, dict[tuple[str, int], int | None]]:
    """Every group's committed offsets; requests for all groups are in flight at once."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = {}
    for group_id in group_ids:
        futures.update(
            admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id)], request_timeout=timeout_s
            )
        )
    out: dict[str, dict[tuple[str, int], int | None]] = {}
    for group_id, fut in futures.items():
        try:
            result = fut.result()
        except Exception as exc:
            log.warning("reading committed offsets of %s failed: %s", group_id, _one_line(exc))
            out[group_id] = {}
            continue
        commits: dict[tuple[str, int], int | None] = {}
        for tp in result.topic_partitions or []:
            # A negative offset (OFFSET_INVALID) means no commit for this partition.
            ok = tp.error is None and tp.offset is not None and tp.offset >= 0
            commits[(tp.topic, tp.partition)] = tp.offset if ok else None
        out[group_id] = commits
    return out


def log_offsets(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout_s: float
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(log start offsets, log end offsets) for the given partitions: two ListOffsets calls."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    parts = sorted(set(partitions))
    results: list[dict[tuple[str, int], int]] = []
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        found: dict[tuple[str, int], int] = {}
        if parts:
            request = {TopicPartition(t, p): spec for t, p in parts}
            for tp, fut in admin.list_offsets(request, request_timeout=timeout_s).items():
                try:
                    found[(tp.topic, tp.partition)] = fut.result().offset
                except Exception as exc:  # partition vanished between the two reads
                    log.warning("no offsets for %s[%d]: %s", tp.topic, tp.partition, _one_line(exc))
        results.append(found)
    return results[0], results[1]


def collect_snapshot(
    admin: Any,
    cluster: str,
    group_pattern: str | None = None,
    now: datetime | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    bootstrap: str | None = None,
):
    """Read one snapshot of all groups whose id matches `group_pattern` in full.

    Returns a pyarrow Table in contract 1 (plus `leader_broker`). A pattern that
    matches nothing gives an empty table, not an error. Raises CollectionError
    with a one-line message when the cluster cannot be reached.
    """
    import pyarrow as pa
    from confluent_kafka import KafkaException

    pattern = compile_group_pattern(group_pattern)
    snapshot_ts = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    where = bootstrap or "the cluster"
    try:
        metadata = admin.list_topics(timeout=timeout_s)
        group_ids = list_group_ids(admin, pattern, timeout_s)
    except KafkaException as exc:
        raise CollectionError(f"cannot reach Kafka at {where}: {_one_line(exc)}") from None

    partitions_of: dict[str, list[int]] = {}
    leader_of: dict[tuple[str, int], int] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            continue
        partitions_of[name] = sorted(topic.partitions)
        for pid, pmeta in topic.partitions.items():
            leader_of[(name, pid)] = pmeta.leader

    try:
        described = describe_groups(admin, group_ids, timeout_s)
        commits = committed_offsets(admin, group_ids, timeout_s)
    except KafkaException as exc:
        raise CollectionError(f"cannot read consumer groups at {where}: {_one_line(exc)}") from None

    views: list[GroupView] = []
    wanted: set[tuple[str, int]] = set()
    for group_id in group_ids:
        state, members, owners = described.get(group_id, ("UNKNOWN", None, {}))
        group_commits = commits.get(group_id, {})
        topics = {t for t, _ in group_commits} | {t for t, _ in owners}
        for gone in sorted(topics - partitions_of.keys()):
            # The offsets outlive a deleted topic; without a log there is no lag to report.
            log.warning("group %s has offsets for topic %s, which no longer exists", group_id, gone)
        for topic in topics & partitions_of.keys():
            wanted.update((topic, p) for p in partitions_of[topic])
        views.append(GroupView(group_id, state, members, owners, group_commits))

    try:
        starts, ends = log_offsets(admin, wanted, timeout_s)
    except KafkaException as exc:
        raise CollectionError(f"cannot list offsets at {where}: {_one_line(exc)}") from None

    rows: dict[str, list[Any]] = {f.name: [] for f in _schema()}
    for view in views:
        topics = sorted({t for t, _ in view.committed} | {t for t, _ in view.owners})
        for topic in topics:
            for partition in partitions_of.get(topic, []):
                key = (topic, partition)
                if key not in ends or key not in starts:
                    continue
                committed = view.committed.get(key)
                end = ends[key]
                owner = view.owners.get(key)
                if committed is not None and committed < starts[key]:
                    log.warning(
                        "group %s is behind log start on %s[%d]: committed %d < %d (retention deleted unread data)",
                        view.group_id, topic, partition, committed, starts[key],
                    )
                _append(
                    rows,
                    snapshot_ts=snapshot_ts,
                    cluster=cluster,
                    group_id=view.group_id,
                    group_state=view.state,
                    topic=topic,
                    partition=partition,
                    log_start_offset=starts[key],
                    log_end_offset=end,
                    committed_offset=committed,
                    # A commit a little above the end offset is a race between reads: lag 0.
                    lag=None if committed is None else max(0, end - committed),
                    member_id=owner.member_id if owner else None,
                    client_id=owner.client_id if owner else None,
                    host=owner.host if owner else None,
                    group_members=view.members,
                    leader_broker=leader_of.get(key),
                )
    return pa.Table.from_pydict(rows, schema=_schema())


def _schema():
    import pyarrow as pa

    base = snapshot_arrow_schema()
    return base.append(pa.field("leader_broker", pa.int32(), nullable=True))


def _append(rows: dict[str, list[Any]], **values: Any) -> None:
    for name, column in rows.items():
        column.append(values.get(name))
