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

Unknown is never zero. A read that fails for one group or partition does not
fail the snapshot and does not drop the row: the row's `read_error` says what
failed, and the values that read would have given are null ("unknown"):

    committed offsets fail   committed_offset, lag null; read_error "committed offsets: ..."
                             (a group whose topics are then unknown, e.g. an EMPTY
                             group, is one row: topic "", partition -1)
    ListOffsets fails        log_start_offset / log_end_offset (and lag) null;
                             read_error "log start offset: ..." / "log end offset: ..."
    describe fails           group_state UNKNOWN, group_members null;
                             read_error "group description: ..."

So the Parquet fields log_start_offset and log_end_offset are written as
nullable; they are null only on rows whose read_error says so. Only a cluster
that cannot be reached at all (metadata or group listing fails) raises
CollectionError.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from lagdoctor.contracts import (
    GROUP_ROW_PARTITION,
    GROUP_ROW_TOPIC,
    SNAPSHOT_NULL_ON_READ_ERROR,
    snapshot_writer_schema,
)
from lagdoctor.kafka_clients import error_text, failure_message, forget_errors

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# Longer patterns are refused: a group pattern is a name filter, not a program.
MAX_GROUP_PATTERN_LENGTH = 1000
WRITTEN_OPTIONAL_COLUMNS = ("leader_broker", "read_error")

# Group state names as confluent-kafka's ConsumerGroupState (PREPARING_REBALANCING),
# as Kafka sends them (PreparingRebalance, and KIP-848's Assigning, Reconciling),
# or as contract 1 spells them, compared without case or separators.
_STATE_NAMES = {
    "STABLE": "STABLE",
    "PREPARINGREBALANCE": "PREPARING_REBALANCE",
    "PREPARINGREBALANCING": "PREPARING_REBALANCE",
    "COMPLETINGREBALANCE": "COMPLETING_REBALANCE",
    "COMPLETINGREBALANCING": "COMPLETING_REBALANCE",
    "EMPTY": "EMPTY",
    "DEAD": "DEAD",
    "ASSIGNING": "ASSIGNING",
    "RECONCILING": "RECONCILING",
    "UNKNOWN": "UNKNOWN",
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
class Description:
    """What DescribeConsumerGroups said about one group (or why it could not)."""

    state: str
    members: int | None
    owners: Mapping[tuple[str, int], Owner]
    error: str | None = None


@dataclass(frozen=True)
class CommitRead:
    """One group's committed offsets: `error` set when the whole read failed, and
    `partition_errors` for partitions the broker answered with an error."""

    commits: Mapping[tuple[str, int], int | None] = field(default_factory=dict)
    partition_errors: Mapping[tuple[str, int], str] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class GroupView:
    group_id: str
    description: Description
    commits: CommitRead

    def topics(self) -> set[str]:
        keys = set(self.commits.commits) | set(self.commits.partition_errors) | set(self.description.owners)
        return {t for t, _ in keys}


def group_state_name(state: Any) -> str:
    """Contract 1 state name for a confluent-kafka ConsumerGroupState, a Kafka state
    string, or None; only a state nobody can name becomes UNKNOWN."""
    name = getattr(state, "name", None) or (str(state) if state is not None else "")
    return _STATE_NAMES.get(re.sub(r"[^A-Z]", "", name.upper()), "UNKNOWN")


def compile_group_pattern(pattern: str | None, what: str = "group_pattern"):
    """A group-id filter matched in full (`orders-.*` matches orders-eu, not
    legacy-orders-eu), in Google RE2: linear time whatever the pattern, so a
    pattern like `(a+)+$` cannot stall a sample on a long group id.

    Returns an object with `.fullmatch(text)`. Raises ValueError, one line
    naming `what` (the option or field the pattern came from) and the problem.
    """
    import re2

    text = pattern if pattern else ".*"
    shown = text if len(text) <= 60 else text[:57] + "..."
    if len(text) > MAX_GROUP_PATTERN_LENGTH:
        raise ValueError(
            f"invalid {what} regex {shown!r}: {len(text)} characters, at most {MAX_GROUP_PATTERN_LENGTH}"
        )
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own line to stderr
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        hint = ""
        if "perl operator" in reason or "escape sequence" in reason:
            hint = " (RE2 syntax: no backreferences or lookaround)"
        raise ValueError(f"invalid {what} regex {shown!r}: {' '.join(reason.split())}{hint}") from None


def _reason(exc: BaseException) -> str:
    """One line for a failed future: librdkafka's text and, when it has one, the error name."""
    first = exc.args[0] if exc.args else None
    text = error_text(exc) or type(exc).__name__
    name = first.name() if hasattr(first, "name") else None
    return f"{text} ({name})" if name and name not in text else text


def list_group_ids(admin: Any, pattern: Any, timeout_s: float) -> list[str]:
    result = admin.list_consumer_groups(request_timeout=timeout_s).result()
    for err in getattr(result, "errors", None) or []:
        log.warning("listing consumer groups on one broker failed: %s", error_text(err))
    return sorted({g.group_id for g in result.valid if pattern.fullmatch(g.group_id)})


def describe_groups(admin: Any, group_ids: list[str], timeout_s: float) -> dict[str, Description]:
    """State, member count and partition owners per group, in one batched call."""
    described: dict[str, Description] = {}
    if not group_ids:
        return described
    for group_id, fut in admin.describe_consumer_groups(group_ids, request_timeout=timeout_s).items():
        try:
            desc = fut.result()
        except Exception as exc:  # e.g. missing DESCRIBE rights on one group
            reason = _reason(exc)
            log.warning("describing group %s failed: %s", group_id, reason)
            described[group_id] = Description("UNKNOWN", None, {}, f"group description: {reason}")
            continue
        state = group_state_name(getattr(desc, "state", None))
        members = list(desc.members or [])
        owners: dict[tuple[str, int], Owner] = {}
        for m in members:
            for tp in getattr(m.assignment, "topic_partitions", None) or []:
                owners[(tp.topic, tp.partition)] = Owner(m.member_id, m.client_id, m.host)
        # An active state with no member list means membership unknown (Tansu,
        # or no DESCRIBE rights), which is not the same as zero members.
        count = len(members) if members or state in _NO_MEMBER_STATES else None
        described[group_id] = Description(state, count, owners)
    return described


def committed_offsets(admin: Any, group_ids: list[str], timeout_s: float) -> dict[str, CommitRead]:
    """Every group's committed offsets; requests for all groups are in flight at once."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = {}
    for group_id in group_ids:
        futures.update(
            admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id)], request_timeout=timeout_s
            )
        )
    out: dict[str, CommitRead] = {}
    for group_id in group_ids:
        fut = futures.get(group_id)
        try:
            if fut is None:
                raise RuntimeError("no answer for this group")
            result = fut.result()
        except Exception as exc:  # coordinator loading or moving, a timeout: unknown, not "no commit"
            reason = _reason(exc)
            log.warning("reading committed offsets of %s failed: %s", group_id, reason)
            out[group_id] = CommitRead(error=f"committed offsets: {reason}")
            continue
        commits: dict[tuple[str, int], int | None] = {}
        errors: dict[tuple[str, int], str] = {}
        for tp in result.topic_partitions or []:
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                errors[key] = f"committed offsets: {_reason(Exception(tp.error))}"
                continue
            # A negative offset (OFFSET_INVALID) means no commit for this partition.
            commits[key] = tp.offset if tp.offset is not None and tp.offset >= 0 else None
        out[group_id] = CommitRead(commits, errors)
    return out


def log_offsets(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout_s: float
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int], dict[tuple[str, int], list[str]]]:
    """(log start offsets, log end offsets, read errors) for the given partitions: two
    ListOffsets calls. A partition whose read failed is absent from the first two
    dicts and has a "log start offset: ..." / "log end offset: ..." line in the third."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    parts = sorted(set(partitions))
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    errors: dict[tuple[str, int], list[str]] = {}
    if not parts:
        return starts, ends, errors
    for spec, found, what in ((OffsetSpec.earliest(), starts, "log start offset"),
                              (OffsetSpec.latest(), ends, "log end offset")):
        request = {TopicPartition(t, p): spec for t, p in parts}
        # READ_COMMITTED: the end offset is the last stable offset, the most a
        # read_committed consumer of a transactional topic can ever reach; the
        # high watermark beyond an open transaction would read as a stall.
        # For topics without transactions the two are equal.
        futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED,
                                     request_timeout=timeout_s)
        answered = {(tp.topic, tp.partition): fut for tp, fut in futures.items()}
        for key in parts:
            fut = answered.get(key)
            try:
                if fut is None:
                    raise RuntimeError("no answer for this partition")
                found[key] = fut.result().offset
            except Exception as exc:  # leader moving, a timeout, the partition vanished between reads
                reason = _reason(exc)
                log.warning("%s of %s[%d] unknown: %s", what, key[0], key[1], reason)
                errors.setdefault(key, []).append(f"{what}: {reason}")
    return starts, ends, errors


def collect_snapshot(
    admin: Any,
    cluster: str,
    group_pattern: str | None = None,
    now: datetime | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    bootstrap: str | None = None,
    group_ids: Collection[str] | None = None,
):
    """Read one snapshot of all groups whose id matches `group_pattern` in full
    (or, with `group_ids`, exactly those groups).

    Returns a pyarrow Table in contract 1 plus `leader_broker` and `read_error`.
    A pattern that matches nothing gives an empty table, not an error. A read
    that fails for one group or partition is recorded in `read_error` (see the
    module docstring); CollectionError (one line naming the address) only when
    the cluster cannot be read at all.
    """
    import pyarrow as pa
    from confluent_kafka import KafkaException

    pattern = compile_group_pattern(group_pattern)
    exact = frozenset(group_ids) if group_ids is not None else None
    snapshot_ts = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    where = bootstrap or "the cluster"
    forget_errors(admin)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
        ids = list_group_ids(admin, pattern, timeout_s)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where)) from None
    if exact is not None:
        ids = [g for g in ids if g in exact]

    partitions_of: dict[str, list[int]] = {}
    leader_of: dict[tuple[str, int], int] = {}
    topic_errors: dict[str, str] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            # Listed but not readable now (leader election, no DESCRIBE right).
            topic_errors[name] = f"topic metadata: {_reason(Exception(topic.error))}"
        partitions_of[name] = sorted(topic.partitions or {})
        for pid, pmeta in (topic.partitions or {}).items():
            leader_of[(name, pid)] = pmeta.leader

    try:
        described = describe_groups(admin, ids, timeout_s)
        commits = committed_offsets(admin, ids, timeout_s)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where, "cannot read consumer groups")) from None

    views: list[GroupView] = []
    rows_of: dict[str, dict[str, list[int]]] = {}
    wanted: set[tuple[str, int]] = set()
    for group_id in ids:
        view = GroupView(
            group_id,
            described.get(group_id, Description("UNKNOWN", None, {}, "group description: no answer for this group")),
            commits.get(group_id, CommitRead(error="committed offsets: no answer for this group")),
        )
        views.append(view)
        topics: dict[str, list[int]] = {}
        for topic in sorted(view.topics()):
            if topic not in partitions_of:
                # The offsets outlive a deleted topic; without a log there is no lag to report.
                log.warning("group %s has offsets for topic %s, which no longer exists", group_id, topic)
                continue
            known = {p for t, p in (*view.commits.commits, *view.commits.partition_errors, *view.description.owners)
                     if t == topic}
            # Metadata lists every partition; a topic whose metadata failed falls back to those the group names.
            topics[topic] = partitions_of[topic] or sorted(known)
            wanted.update((topic, p) for p in topics[topic])
        rows_of[group_id] = topics

    try:
        starts, ends, offset_errors = log_offsets(admin, wanted, timeout_s)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where, "cannot list offsets")) from None

    rows: dict[str, list[Any]] = {f.name: [] for f in snapshot_schema()}
    for view in views:
        desc, read = view.description, view.commits
        group = dict(snapshot_ts=snapshot_ts, cluster=cluster, group_id=view.group_id,
                     group_state=desc.state, group_members=desc.members)
        group_errors = [e for e in (desc.error, read.error) if e]
        if not rows_of[view.group_id]:
            if read.error:
                # Topics unknown because the read that names them failed: one row keeps
                # the group (and its failure) in the snapshot instead of letting it vanish.
                _append(rows, **group, topic=GROUP_ROW_TOPIC, partition=GROUP_ROW_PARTITION,
                        read_error="; ".join(group_errors))
            continue
        for topic, partitions in rows_of[view.group_id].items():
            for partition in partitions:
                key = (topic, partition)
                errors = list(group_errors)
                if topic in topic_errors:
                    errors.append(topic_errors[topic])
                if not read.error and key in read.partition_errors:
                    errors.append(read.partition_errors[key])
                errors.extend(offset_errors.get(key, []))
                commit_known = not read.error and key not in read.partition_errors
                committed = read.commits.get(key) if commit_known else None
                start, end = starts.get(key), ends.get(key)
                if committed is not None and start is not None and committed < start:
                    log.warning(
                        "group %s is behind log start on %s[%d]: committed %d < %d (retention deleted unread data)",
                        view.group_id, topic, partition, committed, start,
                    )
                owner = desc.owners.get(key)
                _append(
                    rows,
                    **group,
                    topic=topic,
                    partition=partition,
                    log_start_offset=start,
                    log_end_offset=end,
                    committed_offset=committed,
                    # A commit a little above the end offset is a race between reads: lag 0.
                    lag=None if committed is None or end is None else max(0, end - committed),
                    member_id=owner.member_id if owner else None,
                    client_id=owner.client_id if owner else None,
                    host=owner.host if owner else None,
                    leader_broker=leader_of.get(key),
                    read_error="; ".join(errors) or None,
                )
    table = pa.Table.from_pydict(rows, schema=snapshot_schema())
    if all(table[name].null_count == 0 for name in SNAPSHOT_NULL_ON_READ_ERROR):
        # Every read succeeded: the file carries contract 1's schema to the letter.
        table = table.cast(snapshot_schema(strict=True))
    return table


def snapshot_schema(strict: bool = False):
    """The schema collect_snapshot returns and the store writes: with `strict`,
    contract 1's exactly; else the log offsets may be null beside a read_error."""
    return snapshot_writer_schema(*WRITTEN_OPTIONAL_COLUMNS, strict=strict)


def _append(rows: dict[str, list[Any]], **values: Any) -> None:
    for name, column in rows.items():
        column.append(values.get(name))
