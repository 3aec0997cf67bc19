"""What the record at a group's position looks like, without reading its payload.

Issue 10 needs two facts a lag number cannot give: the timestamp of the
record at the committed offset (exact time lag, also beyond the window) and,
for a stuck partition, what the stuck record is (timestamp, key hash, size,
header names). `read_records_at` answers both for a bounded set of positions:

- one Consumer, partitions assigned at the given offsets, so librdkafka keeps
  one fetch session per broker: requests grow with brokers, not partitions;
- no group join and no commit (assign, never subscribe; auto commit off);
- read_committed, as the end offsets are read: an aborted record is not the
  one the group will see next;
- at most `max_bytes` fetched per partition (librdkafka still returns a first
  batch larger than that: a position is never unanswerable for size);
- a time budget: what did not answer in it is named, not waited for.

The payload is never kept, logged or returned: its length only. The key is
kept as a short SHA-256 (to tell "the same key keeps failing" apart from a
different one) and header values are dropped, names kept.

Unknown is not zero: a position that could not be read (deleted by
retention, at the end of the log, the budget ran out, an error) is in the
second dict with a one-line reason, never a made-up timestamp.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

Position = tuple[str, int]

# librdkafka's per-partition fetch size: a record's first batch always comes back whole.
DEFAULT_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class RecordMeta:
    """The record at (or, past a gap, first after) a position."""

    offset: int
    timestamp: datetime | None  # None: the producer set no timestamp
    timestamp_type: str  # "create_time" | "log_append_time" | "none"
    key_sha256: str | None  # first 16 hex digits; None: no key
    size: int  # value bytes (0 for a tombstone)
    headers: tuple[str, ...]  # names only, in the record's order


def _timestamp(message: Any) -> tuple[datetime | None, str]:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

    kind, ms = message.timestamp()
    name = {TIMESTAMP_CREATE_TIME: "create_time", TIMESTAMP_LOG_APPEND_TIME: "log_append_time"}.get(kind, "none")
    if name == "none" or ms is None or ms < 0:
        return None, "none"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc), name


def describe_message(message: Any) -> RecordMeta:
    """RecordMeta of a consumed message; the payload is measured and dropped."""
    ts, kind = _timestamp(message)
    key = message.key()
    value = message.value()
    return RecordMeta(
        offset=message.offset(),
        timestamp=ts,
        timestamp_type=kind,
        key_sha256=None if key is None else hashlib.sha256(key).hexdigest()[:16],
        size=0 if value is None else len(value),
        headers=tuple(name for name, _ in (message.headers() or [])),
    )


def read_records_at(
    config: Mapping[str, Any],
    positions: Mapping[Position, int],
    *,
    budget_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[dict[Position, RecordMeta], dict[Position, str]]:
    """({position: the record at its offset}, {position: why it was not read}).

    `config` is a librdkafka client config (bootstrap, security); consumer
    settings are added here. Every position ends up in exactly one dict.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    wanted = {pos: int(offset) for pos, offset in positions.items() if offset is not None and offset >= 0}
    errors: dict[Position, str] = {pos: "no committed offset" for pos in positions if pos not in wanted}
    found: dict[Position, RecordMeta] = {}
    if not wanted:
        return found, errors
    consumer = Consumer({
        **{k: v for k, v in config.items() if k not in ("error_cb",)},
        # Required by the consumer API; assign() never joins it and nothing is committed.
        "group.id": "lagdoctor-record-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",  # a deleted position is named, not silently moved
        "max.partition.fetch.bytes": max(1, int(max_bytes)),
        "fetch.wait.max.ms": 100,
    })
    deadline = time.monotonic() + max(0.0, budget_s)
    try:
        consumer.assign([TopicPartition(t, p, off) for (t, p), off in sorted(wanted.items())])
        pending = set(wanted)
        while pending and time.monotonic() < deadline:
            message = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if message is None:
                continue
            error = message.error()
            pos = (message.topic(), message.partition()) if message.topic() is not None else None
            if error is not None:
                if pos in pending:
                    pending.discard(pos)
                    if error.code() == KafkaError._PARTITION_EOF:
                        errors[pos] = "at the end of the log (nothing to read at the committed offset)"
                    elif error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        errors[pos] = "offset out of range: retention deleted it, or the log restarted"
                    else:
                        errors[pos] = " ".join(str(error.str()).split())
                continue
            if pos in pending and message.offset() >= wanted[pos]:
                found[pos] = describe_message(message)
                pending.discard(pos)
                # one record is all we need here: stop fetching this partition
                consumer.pause([TopicPartition(pos[0], pos[1])])
        for pos in pending:
            errors[pos] = f"not read: the {budget_s:g} s record budget ran out first"
    finally:
        consumer.close()
    return found, errors
