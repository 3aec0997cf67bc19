"""Offset collection: one snapshot of every matching group's offsets (contract 1).

The collector only reads and records; it never decides anything about lag.
Broker requests grow with groups and brokers, not with partitions per group:

    1  Metadata (all topics, partitions and leaders)
    1  ListConsumerGroups (per broker, done by librdkafka)
    1  Metadata of __consumer_offsets: did a coordinator move during the listing?
       (if so, the listing and this once more; see the table below)
    1  ListGroups and DescribeGroups (per broker, librdkafka's list_groups): the
       share and streams groups ListConsumerGroups leaves out
    G  DescribeConsumerGroups, in calls of max_in_flight/4 groups (librdkafka
       sends one request per group, after finding its coordinator)
    G  ListConsumerGroupOffsets, one per group (the API takes one group per
       request)
    3  ListOffsets, earliest, latest and latest read-committed (the last
       stable offset), per LIST_OFFSETS_BATCH partitions
       (lagdoctor.kafka.log_offsets; librdkafka fans each call out per
       partition leader; its cost per call grows faster than the partitions
       in it: 20,000 partitions in one call took 2 s, in calls of 1,000 0.25 s)
    1  DescribeConfigs of the groups' topics (retention.ms, retention.bytes,
       cleanup.policy: the data-loss forecast's input)
    B  Fetch, per broker and round: the record at the committed offset of the
       `record_partitions` most lagging partitions of each (group, topic)
       (lagdoctor.kafka.records: one consumer, assign only, never a commit; groups at
       different offsets of one partition take a round each), within
       `record_budget_s` for the whole snapshot (one deadline for every group;
       each poll waits at most what is left of it). Its timestamp is
       committed_record_ts (exact time lag); its key hash, size and header names
       describe a stuck record. A position it could not read has
       committed_record_error, and is not a read_error: the offsets are known,
       only the record's time is not, and the diagnosis estimates it. Never
       fetched: a commit below the log start ("committed offset below the log
       start (retention removed the records)"), positions past the budget
       ("record read budget of N s spent"), and a topic's other positions once
       a fetch was refused READ ("no READ permission on topic T").

At most `max_in_flight` requests (default DEFAULT_MAX_IN_FLIGHT) wait on the
cluster at once, describe and offset fetches interleaved; each one's timeout
then measures the broker's answer rather than a queue of thousands ahead of
it. No group read starts after the read budget (default read_budget(timeout_s),
60 s), and no log offset read after a quarter of it more (at least two
timeouts): a cluster that stops answering mid-snapshot costs at most the budget
plus one timeout, not a timeout per window of groups, and what was not read is
a read error like any other.

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
    budget ran out first     as the read's own failure, with the reason "not read:
                             the snapshot's N s read budget ran out first"
    group listing fails on   one row, group_id "" (LISTING_ROW_GROUP), topic "", partition -1,
      some broker            read_error "group listing: ...": groups may be missing
    group coordinators move  a broker leaves a moving coordinator's groups out of its answer
      during the listing     with no error: the coordinators (__consumer_offsets leaders) are
                             read again after the listing (one Metadata request); if they
                             moved, the groups are listed again once; if they moved again, or
                             one has no leader, the listing row says so ("group listing: the
                             group coordinators moved ..." / "... have no leader ...")
    a group listed before    (same admin client, same pattern) is read directly and kept, unless
      is not listed now      its coordinator says it is gone (DEAD with no commits); one that
                             only ListGroups lists now is not counted as a share/streams group
    topic not authorized     a topic a group names that metadata leaves out and DescribeTopics
                             refuses: its rows stay, read_error "topic metadata: ..." (a deleted
                             topic, UNKNOWN_TOPIC_OR_PART, is dropped). Kafka's OffsetFetch leaves
                             such a topic's commits out silently: an EMPTY group's rows for it
                             cannot be known at all.

Share and streams groups (Kafka 4) are not consumer groups: ListConsumerGroups
never returns them, the older ListGroups does. The matching ones are counted in
the table's schema metadata (undiagnosed_groups), logged once per process, and
get no rows. Groups the principal may not DESCRIBE are hidden by ListGroups
itself unless it may DESCRIBE the cluster; then their reads fail and their
one row says "not authorized".

The group reads (DescribeConsumerGroups, ListConsumerGroupOffsets) run in a
child process with a client of their own (lagdoctor.kafka.group_reads):
librdkafka crashes the process reading them when a broker restart moves a
group's coordinator (SIGSEGV, librdkafka issue 5040) or brings it back late
(an assertion, issue 4605). A crashed child is retried once; if it crashes
again, every group's reads are read errors ("not read: the Kafka client
crashed (SIGSEGV) ...").

So the Parquet fields log_start_offset and log_end_offset are written as
nullable; they are null only on rows whose read_error says so. Only a cluster
that cannot be reached at all (metadata or group listing fails) raises
CollectionError.
"""

from __future__ import annotations

import gc
import json
import logging
import time
import weakref
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.contracts import (
    NOTHING_TO_READ,
    COMMITTED_RECORD_COLUMNS,
    GROUP_ROW_PARTITION,
    GROUP_ROW_TOPIC,
    LISTING_ROW_GROUP,
    SNAPSHOT_NULL_ON_READ_ERROR,
    snapshot_writer_schema,
)
from lagdoctor.kafka.clients import config_of, failure_message, failure_reason, forget_errors
from lagdoctor.kafka.group_listing import compile_group_pattern, list_groups_checked, listed_before, remember_listed
from lagdoctor.kafka.group_reads import CommitRead, Description, GroupView, group_reader, is_gone, read_groups
from lagdoctor.kafka.log_offsets import log_offsets
from lagdoctor.kafka.records import END_OF_LOG
from lagdoctor.kafka.request_window import DEFAULT_MAX_IN_FLIGHT, RequestWindow, read_budget

# Importable from here, as before they moved to modules of their own.
from lagdoctor.kafka.group_listing import list_group_ids  # noqa: F401
from lagdoctor.kafka.group_reads import IsolatedReader, group_state_name  # noqa: F401

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# Schema metadata key: JSON list of matching groups that are not consumer groups (not diagnosed).
UNDIAGNOSED_METADATA = b"lagdoctor.undiagnosed_groups"
WRITTEN_OPTIONAL_COLUMNS = ("leader_broker", "read_error", *COMMITTED_RECORD_COLUMNS, "retention_ms",
                            "retention_bytes", "group_type", "group_instance_id", "cleanup_policy", "last_stable_offset")
# The record at the committed offset is read for this many most lagging
# partitions of each (group, topic), within this many seconds per snapshot
# (all groups' reads together: one deadline, see lagdoctor.kafka.records).
DEFAULT_RECORD_PARTITIONS = 3
DEFAULT_RECORD_BUDGET_S = 10.0
# committed_record_error of a commit below the log start: not fetched, the time lag is the estimate.
BELOW_LOG_START = "committed offset below the log start (retention removed the records)"


class CollectionError(RuntimeError):
    """The cluster could not be read; the message is one line, safe to print."""


def collect_snapshot(
    admin: Any,
    cluster: str,
    group_pattern: str | None = None,
    now: datetime | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    bootstrap: str | None = None,
    group_ids: Collection[str] | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    read_budget_s: float | None = None,
    record_partitions: int = DEFAULT_RECORD_PARTITIONS,
    record_budget_s: float = DEFAULT_RECORD_BUDGET_S,
    consumer_config: Mapping[str, Any] | None = None,
):
    """Read one snapshot of all groups whose id matches `group_pattern` in full
    (or, with `group_ids`, exactly those groups).

    Returns a pyarrow Table in contract 1 plus `leader_broker` and `read_error`.
    A pattern that matches nothing gives an empty table, not an error. A read
    that fails for one group or partition is recorded in `read_error` (see the
    module docstring); CollectionError (one line naming the address) only when
    the cluster cannot be read at all. At most `max_in_flight` requests wait on
    the cluster at once; no read starts after `read_budget_s` (default
    read_budget(timeout_s)), and what was not read is a read error.

    The record at the committed offset is read for the `record_partitions`
    most lagging partitions of each (group, topic) (0: none) with
    `consumer_config` (default: the config `admin` was built with, when it was
    built here; otherwise no record is read).
    """
    import pyarrow as pa
    from confluent_kafka import KafkaException

    pattern = compile_group_pattern(group_pattern)
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
    exact = frozenset(group_ids) if group_ids is not None else None
    snapshot_ts = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    where = bootstrap or "the cluster"
    started = time.monotonic()
    forget_errors(admin)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
        # Groups this client listed before (a snapshot that asks for given groups neither uses nor updates them).
        before = listed_before(admin, pattern) if exact is None else frozenset()
        listing = list_groups_checked(admin, pattern, timeout_s, metadata, consumer_groups=before)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where)) from None
    ids = listing.ids
    undiagnosed = listing.other
    vanished: set[str] = set()
    if exact is not None:
        ids = [g for g in ids if g in exact]
        undiagnosed = None if undiagnosed is None else [g for g in undiagnosed if g in exact]
    else:
        # Listed by this client before, not now: read directly, kept unless its coordinator says it is gone.
        vanished = set(before) - set(ids)
        ids = sorted(set(ids) | vanished)
    window = RequestWindow(max_in_flight, read_budget(timeout_s) if read_budget_s is None else read_budget_s)

    partitions_of: dict[str, list[int]] = {}
    leader_of: dict[tuple[str, int], int] = {}
    topic_errors: dict[str, str] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            # Listed but not readable now (leader election, no DESCRIBE right).
            topic_errors[name] = f"topic metadata: {failure_reason(Exception(topic.error))}"
        partitions_of[name] = sorted(topic.partitions or {})
        for pid, pmeta in (topic.partitions or {}).items():
            leader_of[(name, pid)] = pmeta.leader
    listed = time.monotonic()

    reader = group_reader(admin)
    try:
        described, commits = read_groups(reader, ids, timeout_s, window)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where, "cannot read consumer groups")) from None
    finally:
        if reader is not admin:
            # Destroyed here, its coordinator lookups with it; a failed future's traceback
            # can hold a frame that holds the client, so collect cycles when it lingers.
            gone = weakref.ref(reader)
            del reader
            if gone() is not None:
                gc.collect()
    groups_read = time.monotonic()

    if vanished:
        gone = {g for g in vanished if is_gone(described[g], commits[g])}
        log.info("%d groups listed before were not listed now; read directly, %d still exist",
                 len(vanished), len(vanished - gone))
        ids = [g for g in ids if g not in gone]
    if exact is None:
        remember_listed(admin, pattern, ids)
    views = [GroupView(g, described[g], commits[g]) for g in ids]
    # Metadata leaves out both deleted topics and those the principal may not describe.
    denied = unreadable_topics(admin, {t for v in views for t in v.topics()} - set(partitions_of), timeout_s)
    for topic, reason in denied.items():
        topic_errors[topic] = reason
        partitions_of[topic] = []
    rows_of: dict[str, dict[str, list[int]]] = {}
    wanted: set[tuple[str, int]] = set()
    for view in views:
        group_id = view.group_id
        topics: dict[str, list[int]] = {}
        for topic, known in sorted(view.partitions_by_topic().items()):
            if topic not in partitions_of:
                # The offsets outlive a deleted topic; without a log there is no lag to report.
                log.warning("group %s has offsets for topic %s, which no longer exists", group_id, topic)
                continue
            # Metadata lists every partition; a topic whose metadata failed falls back to those the group names.
            topics[topic] = partitions_of[topic] or sorted(known)
            wanted.update((topic, p) for p in topics[topic])
        rows_of[group_id] = topics

    try:
        # Log offsets get a budget of their own: a group read that ran the snapshot's
        # budget out must not also leave every partition without its end offset.
        offsets_window = RequestWindow(max_in_flight, max(2 * timeout_s, window.budget_s / 4))
        starts, ends, stables, offset_errors = log_offsets(admin, wanted, timeout_s, offsets_window)
    except KafkaException as exc:
        raise CollectionError(failure_message(exc, admin, where, "cannot list offsets")) from None
    offsets_read = time.monotonic()

    retention = topic_retention(admin, {t for t, _ in wanted}, timeout_s)
    records: dict[tuple[str, int, int], Any] = {}
    record_errors: dict[tuple[str, int, int], str] = {}
    config = consumer_config if consumer_config is not None else config_of(admin)
    positions = record_positions(views, rows_of, ends, offset_errors, record_partitions, starts)
    if record_partitions > 0 and config is not None:
        # Never fetched: the time lag of these falls back to the estimate, saying why.
        record_errors.update(below_log_start(views, rows_of, starts, ends, offset_errors))
    if positions and config is not None:
        from lagdoctor.kafka.records import read_records

        try:
            records, fetch_errors = read_records(config, positions, budget_s=record_budget_s)
        except Exception as exc:  # a consumer that cannot start: the offsets still stand
            reason = f"record not read: {failure_reason(exc)}"
            log.warning("records at committed offsets not read: %s", failure_reason(exc))
            fetch_errors = dict.fromkeys(positions, reason)
        record_errors.update(fetch_errors)
    records_read = time.monotonic()

    if listing.errors:
        # Groups on the brokers that failed to list are missing: one topic-less row says
        # so (group_id LISTING_ROW_GROUP), so the run reads as incomplete, not as "all well".
        views.append(GroupView(LISTING_ROW_GROUP, Description("UNKNOWN", None, {}),
                               CommitRead(error="; ".join(listing.errors))))
        rows_of[LISTING_ROW_GROUP] = {}
    table = _snapshot_table(pa, snapshot_ts, cluster, views, rows_of, topic_errors, leader_of,
                            starts, ends, offset_errors, records, record_errors, retention, stables)
    if undiagnosed is not None:
        # Share and streams groups: counted, never rows (nothing here reads their progress).
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), UNDIAGNOSED_METADATA: json.dumps(undiagnosed).encode()})
    log.debug("snapshot of %d groups, %d rows: metadata and group list %.2f s, groups %.2f s, "
              "log offsets %.2f s, %d records %.2f s, table %.2f s", len(ids), table.num_rows, listed - started,
              groups_read - listed, offsets_read - groups_read, len(records), records_read - offsets_read,
              time.monotonic() - records_read)
    return table


def unreadable_topics(admin: Any, topics: Collection[str], timeout_s: float) -> dict[str, str]:
    """{topic: "topic metadata: ..."} for the topics groups name that the cluster's
    metadata left out for a reason other than "no such topic" (e.g. no DESCRIBE
    right): their rows stay, with this error. A deleted topic is not in it."""
    from confluent_kafka import KafkaError, TopicCollection

    if not topics or not hasattr(admin, "describe_topics"):
        return {}
    try:
        futures = admin.describe_topics(TopicCollection(sorted(topics)), request_timeout=timeout_s)
    except Exception as exc:
        return dict.fromkeys(topics, f"topic metadata: {failure_reason(exc)}")
    out = {}
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout_s + 1)
        except Exception as exc:
            first = exc.args[0] if exc.args else None
            if getattr(first, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            reason = failure_reason(exc)
            log.warning("topic %s is not readable: %s", topic, reason)
            out[topic] = f"topic metadata: {reason}"
            continue
        # Described now but not in the metadata read before: created in between, nothing to read yet.
    return out


def undiagnosed_groups(table: Any) -> list[str] | None:
    """The matching groups of other types (share, streams) a snapshot counted and did not
    read; None when they could not be listed."""
    raw = (table.schema.metadata or {}).get(UNDIAGNOSED_METADATA)
    return None if raw is None else list(json.loads(raw))


def topic_retention(admin: Any, topics: Iterable[str],
                    timeout_s: float) -> dict[str, tuple[int | None, int | None, str | None]]:
    """{topic: (retention.ms, retention.bytes, cleanup.policy)} from DescribeConfigs, one call per snapshot.

    A value the broker does not list, or a read that failed, is None (unknown):
    the forecast then says it cannot tell, never "safe"."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    names = sorted(topics)
    if not names or not hasattr(admin, "describe_configs"):
        return {}
    out: dict[str, tuple[int | None, int | None, str | None]] = {}
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in names],
                                         request_timeout=timeout_s)
    except Exception as exc:
        log.warning("topic retention unknown: %s", failure_reason(exc))
        return {}
    for resource, fut in futures.items():
        try:
            entries = fut.result(timeout=timeout_s + 1)
        except Exception as exc:
            log.warning("retention of topic %s unknown: %s", resource.name, failure_reason(exc))
            continue
        policy = entries.get("cleanup.policy")
        out[resource.name] = (_config_int(entries.get("retention.ms")), _config_int(entries.get("retention.bytes")),
                              _config_policy(policy.value if policy is not None else None))
    return out


def _config_policy(value: Any) -> str | None:
    """"compact,delete" for any spelling of the list ("delete, compact"), None when unsaid."""
    if not value:
        return None
    return ",".join(sorted({p.strip().lower() for p in str(value).split(",") if p.strip()})) or None


def _config_int(entry: Any) -> int | None:
    try:
        return None if entry is None or entry.value is None else int(entry.value)
    except (TypeError, ValueError):
        return None


def _lagging_commits(views, rows_of, ends, offset_errors):
    """(topic, partition, committed offset, lag) per (group, topic) whose offsets were read and have lag."""
    for view in views:
        read = view.commits
        if read.error:
            continue
        for topic, partitions in rows_of[view.group_id].items():
            lagging = []
            for p in partitions:
                key = (topic, p)
                committed, end = read.commits.get(key), ends.get(key)
                if committed is None or end is None or key in read.partition_errors or key in offset_errors:
                    continue
                if end > committed >= 0:
                    lagging.append((topic, p, committed, end - committed))
            yield lagging


def record_positions(views, rows_of, ends, offset_errors, per_topic: int,
                     starts: Mapping[tuple[str, int], int] | None = None) -> list[tuple[str, int, int]]:
    """(topic, partition, committed offset) of the `per_topic` most lagging partitions
    of each (group, topic) whose offsets were read and that have lag, the most
    lagging first (what a record budget that runs out still reads). A commit below
    its partition's log start in `starts` is passed over (see below_log_start)."""
    if per_topic <= 0:
        return []
    starts = starts or {}
    chosen: dict[tuple[str, int, int], int] = {}
    for lagging in _lagging_commits(views, rows_of, ends, offset_errors):
        readable = [(lag, -p, topic, committed) for topic, p, committed, lag in lagging
                    if committed >= starts.get((topic, p), committed)]
        for lag, neg_p, topic, committed in sorted(readable, reverse=True)[:per_topic]:
            position = (topic, -neg_p, committed)
            chosen[position] = max(lag, chosen.get(position, 0))
    return sorted(chosen, key=lambda pos: (-chosen[pos], pos))


def below_log_start(views, rows_of, starts, ends, offset_errors) -> dict[tuple[str, int, int], str]:
    """{(topic, partition, committed offset): why} for commits below their partition's
    log start: retention removed the record there, and a fetch would only fail (or,
    under another auto.offset.reset, read a later record as if it were the group's)."""
    out = {}
    for lagging in _lagging_commits(views, rows_of, ends, offset_errors):
        for topic, p, committed, _ in lagging:
            start = starts.get((topic, p))
            if start is not None and committed < start:
                out[(topic, p, committed)] = BELOW_LOG_START
    return out


def _snapshot_table(pa, snapshot_ts, cluster, views, rows_of, topic_errors, leader_of, starts, ends,
                    offset_errors, records=None, record_errors=None, retention=None, stables=None):
    """The rows as Arrow columns, built column by column (one Python list each)."""
    group_id: list[str] = []
    group_state: list[str] = []
    group_members: list[int | None] = []
    topic_col: list[str] = []
    partition_col: list[int] = []
    start_col: list[int | None] = []
    end_col: list[int | None] = []
    stable_col: list[int | None] = []
    committed_col: list[int | None] = []
    lag_col: list[int | None] = []
    member_col: list[str | None] = []
    client_col: list[str | None] = []
    host_col: list[str | None] = []
    leader_col: list[int | None] = []
    error_col: list[str | None] = []
    records, record_errors = records or {}, record_errors or {}
    record_cols: dict[str, list[Any]] = {name: [] for name in COMMITTED_RECORD_COLUMNS}
    retention = retention or {}
    stables = stables or {}
    retention_ms_col: list[int | None] = []
    retention_bytes_col: list[int | None] = []
    cleanup_col: list[str | None] = []
    group_type_col: list[str | None] = []
    instance_col: list[str | None] = []

    for view in views:
        desc, read = view.description, view.commits
        group_errors = [e for e in (desc.error, read.error) if e]
        blocks = rows_of[view.group_id]
        if not blocks:
            if read.error:
                # Topics unknown because the read that names them failed: one row keeps
                # the group (and its failure) in the snapshot instead of letting it vanish.
                blocks = {GROUP_ROW_TOPIC: [GROUP_ROW_PARTITION]}
            else:
                continue
        commits, partition_errors, owners = read.commits, read.partition_errors, desc.owners
        for topic, partitions in blocks.items():
            n = len(partitions)
            group_id.extend([view.group_id] * n)
            group_state.extend([desc.state] * n)
            group_members.extend([desc.members] * n)
            group_type_col.extend([desc.group_type] * n)
            topic_col.extend([topic] * n)
            partition_col.extend(partitions)
            if topic == GROUP_ROW_TOPIC and partitions == [GROUP_ROW_PARTITION]:
                for column in (start_col, end_col, stable_col, committed_col, lag_col, member_col, client_col, host_col,
                               leader_col, *record_cols.values(), retention_ms_col, retention_bytes_col,
                               cleanup_col, instance_col):
                    column.append(None)
                error_col.append("; ".join(group_errors))
                continue
            topic_error = topic_errors.get(topic)
            for partition in partitions:
                key = (topic, partition)
                start, end = starts.get(key), ends.get(key)
                if read.error or key in partition_errors:
                    committed = None
                else:
                    committed = commits.get(key)
                if committed is not None and start is not None and committed < start:
                    log.warning(
                        "group %s is behind log start on %s[%d]: committed %d < %d (retention deleted unread data)",
                        view.group_id, topic, partition, committed, start,
                    )
                start_col.append(start)
                end_col.append(end)
                stable = stables.get(key)
                stable_col.append(stable)
                committed_col.append(committed)
                # A commit a little above the end offset is a race between reads: lag 0.
                lag_col.append(None if committed is None or end is None else max(0, end - committed))
                owner = owners.get(key) if owners else None
                member_col.append(owner.member_id if owner else None)
                client_col.append(owner.client_id if owner else None)
                host_col.append(owner.host if owner else None)
                instance_col.append(owner.group_instance_id if owner else None)
                leader_col.append(leader_of.get(key))
                ms, size, policy = retention.get(topic, (None, None, None))
                retention_ms_col.append(ms)
                retention_bytes_col.append(size)
                cleanup_col.append(policy)
                record = records.get((topic, partition, committed)) if committed is not None else None
                record_cols["committed_record_ts"].append(record.timestamp if record else None)
                record_cols["committed_record_offset"].append(record.offset if record else None)
                record_cols["committed_record_key_sha256"].append(record.key_sha256 if record else None)
                record_cols["committed_record_size"].append(record.size if record else None)
                record_cols["committed_record_headers"].append(",".join(record.headers) if record else None)
                record_cols["committed_record_error"].append(
                    None if record or committed is None
                    else _record_error_text(record_errors.get((topic, partition, committed)), committed, end, stable))
                if group_errors or topic_error or key in partition_errors or key in offset_errors:
                    errors = list(group_errors)
                    if topic_error:
                        errors.append(topic_error)
                    if not read.error and key in partition_errors:
                        errors.append(partition_errors[key])
                    errors.extend(offset_errors.get(key, []))
                    error_col.append("; ".join(errors))
                else:
                    error_col.append(None)

    schema = snapshot_schema()
    n = len(group_id)
    ts_type = schema.field("snapshot_ts").type
    columns = {
        "snapshot_ts": pa.repeat(pa.scalar(snapshot_ts, type=ts_type), n),
        "cluster": pa.repeat(pa.scalar(cluster, type=pa.string()), n),
        "group_id": group_id,
        "group_state": group_state,
        "topic": topic_col,
        "partition": partition_col,
        "log_start_offset": start_col,
        "log_end_offset": end_col,
        "committed_offset": committed_col,
        "lag": lag_col,
        "member_id": member_col,
        "client_id": client_col,
        "host": host_col,
        "group_members": group_members,
        "leader_broker": leader_col,
        "read_error": error_col,
        **record_cols,
        "retention_ms": retention_ms_col,
        "retention_bytes": retention_bytes_col,
        "group_type": group_type_col,
        "group_instance_id": instance_col,
        "cleanup_policy": cleanup_col,
        "last_stable_offset": stable_col,
    }
    table = pa.Table.from_arrays(
        [columns[f.name] if isinstance(columns[f.name], pa.Array) else pa.array(columns[f.name], type=f.type)
         for f in schema], schema=schema)
    if all(table[name].null_count == 0 for name in SNAPSHOT_NULL_ON_READ_ERROR):
        # Every read succeeded: the file carries contract 1's schema to the letter.
        table = table.cast(snapshot_schema(strict=True))
    return table


def _record_error_text(error: str | None, committed: int, end: int | None, stable: int | None) -> str | None:
    """Why no record was read, with what the offsets say of the end of the log: a
    read_committed read ends at the last stable offset, and what lies beyond is an
    open transaction or transaction markers, not data the group can read yet."""
    if error is None or not error.startswith(END_OF_LOG) or end is None or committed >= end:
        return error
    if stable is not None and stable < end and committed >= stable:
        return (f"at the last stable offset {stable}: offsets {stable}..{end - 1} are in an open transaction "
                "(a read_committed consumer waits until it ends)")
    return (f"{NOTHING_TO_READ} offsets {committed}..{end - 1} hold transaction markers or aborted records only "
            "(no data record after the committed offset)")


def snapshot_schema(strict: bool = False):
    """The schema collect_snapshot returns and the store writes: with `strict`,
    contract 1's exactly; else the log offsets may be null beside a read_error."""
    return snapshot_writer_schema(*WRITTEN_OPTIONAL_COLUMNS, strict=strict)
