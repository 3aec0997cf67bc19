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
- one time budget for every position (a snapshot's, all groups together):
  each poll waits at most what is left of it, and what did not answer in it
  is named ("record read budget of N s spent"), not waited for;
- a topic whose fetch is refused READ (TOPIC_AUTHORIZATION_FAILED) is tried
  once: its other positions are not fetched, and all say "no READ permission
  on topic T" (logged once).

The payload is never kept, logged or returned: its length only. The key is
kept as a short SHA-256 (to tell "the same key keeps failing" apart from a
different one) and header values are dropped, names kept.

Unknown is not zero: a position that could not be read (deleted by
retention, at the end of the log, the budget ran out, an error) is in the
second dict with a one-line reason, never a made-up timestamp.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

Position = tuple[str, int]

# librdkafka's per-partition fetch size: a record's first batch always comes back whole.
DEFAULT_MAX_BYTES = 64 * 1024
# Partitions per assignment: one consumer's cost grows faster than its assignment
# (20,000 partitions at once took 15 s on the embedded broker, in assignments of
# 500 2.3 s), and small assignments let the most important positions go first.
ASSIGN_BATCH = 500
# Why a position gave no record because the read reached the end: a read_committed
# read ends at the last stable offset, so what follows may be an open transaction.
END_OF_LOG = "at the end of the log"


def budget_spent(budget_s: float) -> str:
    """Why a position was not read: the snapshot's record budget ran out before it."""
    return f"record read budget of {budget_s:g} s spent"


def read_denied(topic: str) -> str:
    """Why a topic's positions were not read: the principal may describe it but not READ it."""
    return f"no READ permission on topic {topic}"


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


Wanted = tuple[str, int, int]  # (topic, partition, offset)


def read_records_at(
    config: Mapping[str, Any],
    positions: Mapping[Position, int | None],
    *,
    budget_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[dict[Position, RecordMeta], dict[Position, str]]:
    """({position: the record at its offset}, {position: why it was not read}).

    `config` is a librdkafka client config (bootstrap, security); consumer
    settings are added here. Every position ends up in exactly one dict.
    """
    errors: dict[Position, str] = {pos: "no committed offset" for pos, off in positions.items()
                                   if off is None or off < 0}
    wanted = [(t, p, int(off)) for (t, p), off in positions.items() if (t, p) not in errors]
    found, failed = read_records(config, wanted, budget_s=budget_s, max_bytes=max_bytes)
    errors.update({(t, p): reason for (t, p, _), reason in failed.items()})
    return {(t, p): meta for (t, p, _), meta in found.items()}, errors


def rounds_of(wanted: Iterable[Wanted], batch: int = ASSIGN_BATCH) -> list[dict[Position, int]]:
    """Split (topic, partition, offset), in the caller's order of importance, into
    assignments of at most `batch` partitions. One assignment holds one offset per
    partition, so groups at different offsets of a shared partition land in
    different assignments; earlier positions land in earlier ones, so a budget
    that runs out leaves the last (least important) unread."""
    rounds: list[dict[Position, int]] = []
    next_for: dict[Position, int] = {}  # the first assignment a partition may still join
    first_open = 0
    seen: set[Wanted] = set()
    for t, p, off in wanted:
        if (t, p, off) in seen:
            continue
        seen.add((t, p, off))
        while first_open < len(rounds) and len(rounds[first_open]) >= batch:
            first_open += 1
        i = max(first_open, next_for.get((t, p), 0))
        while i < len(rounds) and len(rounds[i]) >= batch:
            i += 1
        if i == len(rounds):
            rounds.append({})
        rounds[i][(t, p)] = off
        next_for[(t, p)] = i + 1
    return rounds


def read_records(
    config: Mapping[str, Any],
    wanted: Iterable[Wanted],
    *,
    budget_s: float = 5.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[dict[Wanted, RecordMeta], dict[Wanted, str]]:
    """({(topic, partition, offset): the record there}, {(topic, partition, offset): why not}).

    One consumer for every assignment (see rounds_of), the most important
    positions (first in `wanted`) first; the budget covers them all. Every
    wanted position ends up in exactly one dict.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    rounds = rounds_of(wanted)
    found: dict[Wanted, RecordMeta] = {}
    errors: dict[Wanted, str] = {}
    if not rounds:
        return found, errors
    settings = {
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
    }
    # One deadline for every assignment: each poll waits at most what is left of it.
    deadline = time.monotonic() + max(0.0, budget_s)
    out_of_budget = budget_spent(budget_s)
    denied: set[str] = set()  # topics the principal may not READ: fetched once, never again
    for assignment in rounds:
        skipped = {(t, p): off for (t, p), off in assignment.items() if t in denied}
        errors.update({(t, p, off): read_denied(t) for (t, p), off in skipped.items()})
        assignment = {pos: off for pos, off in assignment.items() if pos not in skipped}
        if not assignment:
            continue
        if time.monotonic() >= deadline:
            errors.update({(t, p, off): out_of_budget for (t, p), off in assignment.items()})
            continue
        # A consumer per assignment: one that was assigned before keeps the old
        # partitions' state (20,000 positions: 39 s reusing one, 2.3 s with a new one each 500).
        consumer = Consumer(settings)
        pending = dict(assignment)
        try:
            consumer.assign([TopicPartition(t, p, off) for (t, p), off in sorted(assignment.items())])
            while pending and time.monotonic() < deadline:
                message = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
                if message is None:
                    continue
                error = message.error()
                pos = (message.topic(), message.partition()) if message.topic() is not None else None
                if error is not None:
                    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and pos is not None:
                        # Denied for the whole topic: every position of it falls back, said once.
                        topic = pos[0]
                        if topic not in denied:
                            denied.add(topic)
                            log.warning("records of topic %s not read (time lag estimated): %s",
                                        topic, " ".join(str(error.str()).split()))
                        mine = [q for q in pending if q[0] == topic]
                        errors.update({(*q, pending.pop(q)): read_denied(topic) for q in mine})
                        consumer.pause([TopicPartition(*q) for q in mine])
                    elif pos in pending:
                        key = (*pos, pending.pop(pos))
                        if error.code() == KafkaError._PARTITION_EOF:
                            errors[key] = f"{END_OF_LOG} (nothing to read at the committed offset)"
                        elif error.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                            # auto.offset.reset=error: librdkafka says _AUTO_OFFSET_RESET, not the broker's code
                            errors[key] = "offset out of range: retention deleted it, or the log restarted"
                        else:
                            errors[key] = " ".join(str(error.str()).split())
                    continue
                if pos in pending and message.offset() >= pending[pos]:
                    found[(*pos, pending.pop(pos))] = describe_message(message)
                    # one record is all we need here: stop fetching this partition
                    consumer.pause([TopicPartition(pos[0], pos[1])])
        finally:
            errors.update({(t, p, off): out_of_budget for (t, p), off in pending.items()})
            consumer.close()
    return found, errors
