"""The public data contracts (shared/CONTRACTS.md), in one place.

Everything that reads or writes snapshots, findings or partition status takes
its column names and types from here; tests compare these against the page.
No heavy imports at module level: pyarrow and pyspark types are built lazily.
"""

from __future__ import annotations

from typing import Final

# Contract 1: offset snapshot. (name, arrow type name, nullable)
SNAPSHOT_COLUMNS: Final[tuple[tuple[str, str, bool], ...]] = (
    ("snapshot_ts", "timestamp[us, UTC]", False),
    ("cluster", "string", False),
    ("group_id", "string", False),
    ("group_state", "string", False),
    ("topic", "string", False),
    ("partition", "int32", False),
    ("log_start_offset", "int64", False),
    ("log_end_offset", "int64", False),
    ("committed_offset", "int64", True),
    ("lag", "int64", True),
    ("member_id", "string", True),
    ("client_id", "string", True),
    ("host", "string", True),
    ("group_members", "int32", True),
)
# Optional columns a reader must tolerate being absent or null.
# read_error: null when every read behind the row succeeded; otherwise one line
# prefixed by what failed ("committed offsets: ...", "log end offset: ...",
# "group description: ..."). Values that read could not give are null and mean
# "unknown": committed_offset/lag after a failed committed-offset read (not "no
# commit"), log_start_offset/log_end_offset/lag after a failed ListOffsets.
#
# committed_record_*: the record at the committed offset (the next one the group
# will read), fetched for the most lagging partitions of each group only, so
# null elsewhere. The payload is never stored: its offset (the first record at
# or after the committed offset: compaction and transaction markers leave gaps),
# a 16-hex SHA-256 prefix of its key, its value's size and its header names
# (comma-separated). committed_record_error says why a fetched position gave no
# record (end of log, deleted by retention, the budget ran out).
SNAPSHOT_OPTIONAL_COLUMNS: Final[tuple[tuple[str, str, bool], ...]] = (
    ("committed_record_ts", "timestamp[us, UTC]", True),
    ("leader_broker", "int32", True),
    ("read_error", "string", True),
    ("committed_record_offset", "int64", True),
    ("committed_record_key_sha256", "string", True),
    ("committed_record_size", "int64", True),
    ("committed_record_headers", "string", True),
    ("committed_record_error", "string", True),
    ("retention_ms", "int64", True),
    ("retention_bytes", "int64", True),
    ("group_type", "string", True),
    ("group_instance_id", "string", True),
    ("cleanup_policy", "string", True),
    ("last_stable_offset", "int64", True),
)
# retention_ms / retention_bytes: the topic's retention.ms and retention.bytes
# (DescribeConfigs, once per snapshot per topic); -1 is Kafka's "no limit";
# null when the broker did not say (the read failed or it lists no value).
# group_type: the group's protocol type from DescribeConsumerGroups, "consumer"
# (KIP-848) or "classic"; null when the client does not say.
# group_instance_id: the owning member's static group.instance.id; null when
# the partition has no owner or the owner is not a static member.
# cleanup_policy: the topic's cleanup.policy ("delete", "compact",
# "compact,delete"), read with retention_ms; null when the broker did not say.
# last_stable_offset: ListOffsets latest with READ_COMMITTED, the most a
# read_committed consumer can reach; below log_end_offset (the high watermark,
# READ_UNCOMMITTED) while a transaction is open, equal on topics without
# transactions; null when its read failed (read_error says so).
# committed_record_error begins with this when the read reached the end of the log
# and no open transaction explains the lag: the offsets left hold transaction
# markers or aborted records only, so the group has read everything it will see.
NOTHING_TO_READ: Final[str] = "nothing to read:"
# The committed_record_* columns, as the collector writes them.
COMMITTED_RECORD_COLUMNS: Final[tuple[str, ...]] = (
    "committed_record_ts",
    "committed_record_offset",
    "committed_record_key_sha256",
    "committed_record_size",
    "committed_record_headers",
    "committed_record_error",
)
SNAPSHOT_COLUMN_NAMES: Final[tuple[str, ...]] = tuple(c[0] for c in SNAPSHOT_COLUMNS)
# Contract columns that are null on a row whose read_error says their read
# failed; the writer's Parquet schema declares them nullable for that reason.
SNAPSHOT_NULL_ON_READ_ERROR: Final[tuple[str, ...]] = ("log_start_offset", "log_end_offset")
# A group whose committed offsets could not be read and whose topics are unknown
# (an EMPTY group has no assignment to learn them from) is kept as one row with
# this topic and partition, so it never vanishes from a snapshot.
GROUP_ROW_TOPIC: Final[str] = ""
GROUP_ROW_PARTITION: Final[int] = -1
# The same row with this group_id says the group listing itself failed on some
# broker (ListConsumerGroups errors): groups may be missing from the snapshot.
LISTING_ROW_GROUP: Final[str] = ""

GROUP_STATES: Final[tuple[str, ...]] = (
    "STABLE",
    "PREPARING_REBALANCE",
    "COMPLETING_REBALANCE",
    "EMPTY",
    "DEAD",
    "ASSIGNING",
    "RECONCILING",
    "UNKNOWN",
)
# States in which a group has no live consumers.
INACTIVE_GROUP_STATES: Final[frozenset[str]] = frozenset({"EMPTY", "DEAD"})
REBALANCING_GROUP_STATES: Final[frozenset[str]] = frozenset(
    {"PREPARING_REBALANCE", "COMPLETING_REBALANCE", "ASSIGNING", "RECONCILING"}
)

# Contract 2: diagnosis job outputs.
DIAGNOSES: Final[tuple[str, ...]] = (
    "healthy",
    "partition_imbalance",
    "producer_surge",
    "slow_consumer",
    "stalled_consumer",
    "crashed_consumer",
    "rebalance_loop",
    "collecting_history",
)
# Extensions of contract 2's diagnosis values (the page lists the rest).
# collecting_history (issue 29): the group has fewer snapshots than the rules need; no verdict
# yet, so neither healthy nor a problem: no incident, no report, no remediation, no recovery.
COLLECTING_HISTORY: Final[str] = "collecting_history"
DIAGNOSIS_EXTENSIONS: Final[tuple[str, ...]] = (COLLECTING_HISTORY,)
# Diagnoses that are no problem to report.
NO_PROBLEM_DIAGNOSES: Final[frozenset[str]] = frozenset({"healthy", COLLECTING_HISTORY})
PATTERNS: Final[tuple[str, ...]] = (
    "flat",
    "steady_climb",
    "spiky",
    "staircase",
    "roller_coaster",
    "plateau",
    "sawtooth",
    "explosion",
)
SEVERITIES: Final[tuple[str, ...]] = ("ok", "warning", "critical")
FINDING_FIELDS: Final[tuple[str, ...]] = (
    "cluster",
    "group_id",
    "topic",
    "partitions",
    "diagnosis",
    "pattern",
    "severity",
    "summary",
    "evidence",
    "window_start",
    "window_end",
)
PARTITION_STATUS_FIELDS: Final[tuple[str, ...]] = (
    "cluster",
    "group_id",
    "topic",
    "partition",
    "status",
    "lag",
    "time_lag_seconds",
    "consume_rate",
    "produce_rate",
)
FINDINGS_FILE: Final[str] = "findings.jsonl"
PARTITION_STATUS_FILE: Final[str] = "partition_status.jsonl"
QUARANTINED_FILE: Final[str] = "quarantined.jsonl"  # files the job moved aside (not a contract output)
# Added to contract 2 (issue 17): the job writes SUCCESS_FILE last, once every output is in place
# ({"outputs": {name: {"rows", "bytes"}}, "finished_at"}), and WRITING_FILE before its first
# output (removed after SUCCESS_FILE). lagdoctor.runindex.run_completeness reads them.
SUCCESS_FILE: Final[str] = "_SUCCESS"
WRITING_FILE: Final[str] = "_WRITING"

# Contract 3: Burrow statuses, least to most bad (a group's status is its
# worst partition's).
PARTITION_STATUSES: Final[tuple[str, ...]] = ("OK", "WARN", "ERR", "STOP", "STALL", "REWIND")

# Contract 5
SWEEP_DAG_ID: Final[str] = "kafka_lag_health_sweep"
INCIDENT_DAG_ID: Final[str] = "kafka_lag_incident"


def snapshot_arrow_schema(include_optional: bool = False):
    """The pyarrow schema of contract 1."""
    import pyarrow as pa

    types = {
        "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
        "string": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
    }
    cols = SNAPSHOT_COLUMNS + (SNAPSHOT_OPTIONAL_COLUMNS if include_optional else ())
    return pa.schema([pa.field(name, types[t], nullable=n) for name, t, n in cols])


def snapshot_writer_schema(*optional: str, strict: bool = False):
    """The Parquet schema the collector writes: contract 1, then the named optional
    columns, with SNAPSHOT_NULL_ON_READ_ERROR nullable (null only beside a
    read_error) unless `strict` (a snapshot whose every read succeeded)."""
    import pyarrow as pa

    base = snapshot_arrow_schema(include_optional=True)
    fields = [
        f.with_nullable(True) if f.name in SNAPSHOT_NULL_ON_READ_ERROR and not strict else f
        for f in base
        if f.name in SNAPSHOT_COLUMN_NAMES or f.name in optional
    ]
    unknown = set(optional) - {c[0] for c in SNAPSHOT_OPTIONAL_COLUMNS}
    if unknown:
        raise ValueError(f"not an optional column of contract 1: {', '.join(sorted(unknown))}")
    return pa.schema(fields)


def snapshot_spark_schema(include_optional: bool = False):
    """The Spark StructType of contract 1 (imports pyspark: Spark side only)."""
    from pyspark.sql import types as T

    types = {
        "timestamp[us, UTC]": T.TimestampType(),
        "string": T.StringType(),
        "int32": T.IntegerType(),
        "int64": T.LongType(),
    }
    cols = SNAPSHOT_COLUMNS + (SNAPSHOT_OPTIONAL_COLUMNS if include_optional else ())
    return T.StructType([T.StructField(name, types[t], n) for name, t, n in cols])
