"""Log offsets of partitions: ListOffsets earliest, latest and last stable,
in batches, asked again once where a partition's leader moved."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from lagdoctor.kafka.clients import failure_reason
from lagdoctor.kafka.request_window import DEFAULT_MAX_IN_FLIGHT, RequestWindow, read_budget

# A child of the collector's logger: a logging config naming lagdoctor.kafka.collector still covers these lines.
log = logging.getLogger("lagdoctor.kafka.collector.log_offsets")

# Partitions per ListOffsets call; lagdoctor.kafka.collector's docstring says why 1,000.
LIST_OFFSETS_BATCH = 1000


def log_offsets(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout_s: float, window: RequestWindow | None = None
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int], dict[tuple[str, int], int],
           dict[tuple[str, int], list[str]]]:
    """(log start offsets, log end offsets, last stable offsets, read errors) for
    the given partitions: ListOffsets earliest, latest and latest READ_COMMITTED,
    LIST_OFFSETS_BATCH partitions per call. A partition whose read failed is
    absent from the first three dicts and has a "log start offset: ..." / "log
    end offset: ..." / "last stable offset: ..." line in the fourth.

    The log end offset is the high watermark, as kafka-consumer-groups.sh shows
    it: a read_uncommitted consumer reads up to it. The last stable offset is
    where a read_committed consumer stops while a transaction is open; on
    topics without transactions the two are equal."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    window = window or RequestWindow(DEFAULT_MAX_IN_FLIGHT, read_budget(timeout_s))
    parts = sorted(set(partitions))
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    stables: dict[tuple[str, int], int] = {}
    errors: dict[tuple[str, int], list[str]] = {}
    specs = (
        (OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED, starts, "log start offset"),
        (OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED, ends, "log end offset"),
        (OffsetSpec.latest(), IsolationLevel.READ_COMMITTED, stables, "last stable offset"),
    )

    def ask(keys_per_spec: list[list[tuple[str, int]]]) -> list[dict[tuple[str, int], Future]]:
        answers: list[dict[tuple[str, int], Future]] = [{} for _ in specs]
        wanted = [set(keys) for keys in keys_per_spec]
        every = sorted(set().union(*wanted))
        # batch by batch, the three reads of a batch together: a budget that runs out leaves
        # whole partitions unread, not every partition's end offset
        for begin in range(0, len(every), LIST_OFFSETS_BATCH):
            for (spec, isolation, _, _), keys, answered in zip(specs, wanted, answers):
                batch = [TopicPartition(t, p) for t, p in every[begin:begin + LIST_OFFSETS_BATCH] if (t, p) in keys]
                if not batch:
                    continue
                request = {tp: spec for tp in batch}
                futures = window.call(batch, lambda r=request, i=isolation: admin.list_offsets(
                    r, isolation_level=i, request_timeout=timeout_s))
                answered.update(((tp.topic, tp.partition), fut) for tp, fut in futures.items())
        return answers

    def settle(keys_per_spec, answers, last: bool) -> list[list[tuple[str, int]]]:
        """Record each answer; return the keys to ask again (a leader that moved), unless `last`."""
        again: list[list[tuple[str, int]]] = [[] for _ in specs]
        for (_, _, found, what), keys, answered, retry in zip(specs, keys_per_spec, answers, again):
            for key in keys:
                fut = answered.get(key)
                try:
                    if fut is None:
                        raise RuntimeError("no answer for this partition")
                    offset = fut.result().offset
                    if offset is None or offset < 0:
                        # Seen while a killed leader's partitions move: an answer without an error
                        # whose offset is OFFSET_INVALID (-1001). Not an offset: unknown, never lag 0.
                        raise LeaderMoving(f"no offset in the answer ({offset}), the partition's leader may be moving")
                    found[key] = offset
                except Exception as exc:  # leader moving, a timeout, the partition vanished between reads
                    if not last and _leader_moved(exc):
                        retry.append(key)
                        continue
                    reason = failure_reason(exc) + (" (and again after a retry)" if _leader_moved(exc) else "")
                    log.warning("%s of %s[%d] unknown: %s", what, key[0], key[1], reason)
                    errors.setdefault(key, []).append(f"{what}: {reason}")
        return again

    # A leader that moved (a rolling restart, a broker coming up) answers NOT_LEADER: the client
    # learns the new leader from fresh metadata, so those partitions are asked once more.
    again = settle([parts] * len(specs), ask([parts] * len(specs)), last=False)
    if any(again):  # past the read budget, the window fails these calls as "not read"
        time.sleep(min(LEADER_MOVE_PAUSE_S, max(0.0, window.remaining())))
        settle(again, ask(again), last=True)
    for key, lines in errors.items():
        # A failed end offset read says it all: the stable offset comes from the same
        # request kind to the same leader, and one reason per row is enough to act on.
        if any(line.startswith("log end offset: ") for line in lines):
            errors[key] = [line for line in lines if not line.startswith("last stable offset: ")]
    for key, stable in stables.items():
        # The two reads race: a marker written between them can put the stable offset
        # above the high watermark read just before (seen live after an abort).
        if key in ends and stable > ends[key]:
            stables[key] = ends[key]
    return starts, ends, stables, errors


# partition errors that mean "ask the new leader": librdkafka refreshes its metadata on them
LEADER_MOVED_ERRORS = frozenset({"NOT_LEADER_FOR_PARTITION", "NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE",
                                 "REPLICA_NOT_AVAILABLE", "UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH",
                                 "OFFSET_NOT_AVAILABLE"})
LEADER_MOVE_PAUSE_S = 0.5


class LeaderMoving(RuntimeError):
    """An answer without an offset and without an error: seen while a partition's leader moves."""


def _leader_moved(exc: BaseException) -> bool:
    if isinstance(exc, LeaderMoving):
        return True
    first = exc.args[0] if exc.args else None
    return hasattr(first, "name") and first.name() in LEADER_MOVED_ERRORS
