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
    2  ListOffsets, earliest and latest, per LIST_OFFSETS_BATCH partitions
       (librdkafka fans each call out per partition leader; its cost per call
       grows faster than the partitions in it: 20,000 partitions in one call
       took 2 s, in calls of 1,000 0.25 s)
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
child process with a client of their own (group_reader): librdkafka crashes
the process reading them when a broker restart moves a group's coordinator
(SIGSEGV, librdkafka issue 5040) or brings it back late (an assertion, issue
4605). A crashed child is retried once; if it crashes again, every group's
reads are read errors ("not read: the Kafka client crashed (SIGSEGV) ...").

So the Parquet fields log_start_offset and log_end_offset are written as
nullable; they are null only on rows whose read_error says so. Only a cluster
that cannot be reached at all (metadata or group listing fails) raises
CollectionError.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
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
from lagdoctor.kafka.clients import config_of, error_text, failure_message, forget_errors
from lagdoctor.kafka.records import END_OF_LOG

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# Schema metadata key: JSON list of matching groups that are not consumer groups (not diagnosed).
UNDIAGNOSED_METADATA = b"lagdoctor.undiagnosed_groups"
# Longer patterns are refused: a group pattern is a name filter, not a program.
MAX_GROUP_PATTERN_LENGTH = 1000
WRITTEN_OPTIONAL_COLUMNS = ("leader_broker", "read_error", *COMMITTED_RECORD_COLUMNS, "retention_ms",
                            "retention_bytes", "group_type", "group_instance_id", "cleanup_policy", "last_stable_offset")
# Requests waiting on the cluster at once: enough to hide round trips (the group
# reads of 10,000 groups took about 6 s on the embedded broker, and 1,024 in flight
# were no faster), far below a broker's request queue (queued.max.requests, 500).
DEFAULT_MAX_IN_FLIGHT = 128
# Partitions per ListOffsets call; see the module docstring.
LIST_OFFSETS_BATCH = 1000
# The record at the committed offset is read for this many most lagging
# partitions of each (group, topic), within this many seconds per snapshot
# (all groups' reads together: one deadline, see lagdoctor.kafka.records).
DEFAULT_RECORD_PARTITIONS = 3
DEFAULT_RECORD_BUDGET_S = 10.0
# committed_record_error of a commit below the log start: not fetched, the time lag is the estimate.
BELOW_LOG_START = "committed offset below the log start (retention removed the records)"

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
    group_instance_id: str | None = None


@dataclass(frozen=True)
class Description:
    """What DescribeConsumerGroups said about one group (or why it could not)."""

    state: str
    members: int | None
    owners: Mapping[tuple[str, int], Owner]
    error: str | None = None
    group_type: str | None = None


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
        return set(self.partitions_by_topic())

    def partitions_by_topic(self) -> dict[str, set[int]]:
        """The partitions this group's reads name, per topic."""
        out: dict[str, set[int]] = {}
        for keys in (self.commits.commits, self.commits.partition_errors, self.description.owners):
            for topic, partition in keys:
                out.setdefault(topic, set()).add(partition)
        return out


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


def _failed(exc: BaseException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


class RequestWindow:
    """Bounds the admin requests outstanding at once and when the last may start.

    `call` takes `weight` slots (the requests the call sends) before sending and
    frees them when every future the call returned is done, so at most `limit`
    requests wait on the cluster: a request's timeout then measures the broker's
    answer, not a queue of thousands behind it, and a real cluster is not
    flooded. A call that would start after `budget_s` is not sent: its futures
    fail with "not read: ..." (recorded as read errors), so a cluster that
    stops answering mid-snapshot costs at most the budget plus one timeout,
    not one timeout per window of groups.
    """

    def __init__(self, limit: int, budget_s: float) -> None:
        if limit < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {limit}")
        self.limit, self.budget_s = limit, budget_s
        self._slots = threading.Semaphore(limit)
        self._deadline = time.monotonic() + budget_s

    def remaining(self) -> float:
        """Seconds left before no more calls start."""
        return self._deadline - time.monotonic()

    def call(self, keys: Iterable[Any], send: Callable[[], dict[Any, Future]], weight: int = 1) -> dict[Any, Future]:
        weight = min(max(1, weight), self.limit)
        taken = 0
        while taken < weight and self._slots.acquire(timeout=max(0.0, self._deadline - time.monotonic())):
            taken += 1
        if taken < weight or time.monotonic() > self._deadline:
            if taken:
                self._slots.release(taken)
            late = TimeoutError(f"not read: the snapshot's {self.budget_s:g} s read budget ran out first")
            return {key: _failed(late) for key in keys}
        try:
            futures = send()
        except BaseException:
            self._slots.release(taken)
            raise
        if not futures:
            self._slots.release(taken)
            return futures
        pending = [len(futures)]
        lock = threading.Lock()

        def done(_: Future) -> None:  # on librdkafka's thread, or here if already done
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                self._slots.release(taken)

        for fut in futures.values():
            fut.add_done_callback(done)
        return futures


@dataclass(frozen=True)
class GroupListing:
    """The consumer groups listed, the brokers' listing errors (some groups may be
    missing), and the matching groups of other types (share, streams), None when
    they could not be listed."""

    ids: list[str]
    errors: list[str] = field(default_factory=list)
    other: list[str] | None = None


# Share and streams groups already said "not diagnosed" in this process: said once, not every sweep.
_NOTED_OTHER: set[str] = set()
_NOTED_LOCK = threading.Lock()


def list_groups(admin: Any, pattern: Any, timeout_s: float, *, other: bool = True) -> GroupListing:
    """ListConsumerGroups (consumer and classic groups; librdkafka leaves share and
    streams groups out), and with `other` the matching groups it left out."""
    result = admin.list_consumer_groups(request_timeout=timeout_s).result()
    errors = []
    for err in getattr(result, "errors", None) or []:
        log.warning("listing consumer groups on one broker failed: %s", error_text(err))
        kerr = err.args[0] if isinstance(err, BaseException) and err.args else err
        errors.append(f"group listing: {_reason(Exception(kerr))}")
    ids = sorted({g.group_id for g in result.valid if pattern.fullmatch(g.group_id)})
    return GroupListing(ids, errors, other_group_ids(admin, ids, pattern, timeout_s) if other else None)


def other_group_ids(admin: Any, consumer_ids: Collection[str], pattern: Any, timeout_s: float,
                    missed: list[str] | None = None) -> list[str] | None:
    """Matching groups that are not consumer groups (share, streams), which lagdoctor does not diagnose.

    confluent-kafka 2.16 has no share or streams ConsumerGroupType and its
    ListConsumerGroups never returns those groups; the older ListGroups
    (`list_groups`) lists every group the principal may describe, so the
    difference is the rest. None when that listing fails (unknown).

    A share or streams group is Dead to ListGroups' describe; one in any other
    state, of protocol type consumer (or none: commits only), is a consumer group
    ListConsumerGroups missed (its coordinator moved in between): it goes to
    `missed` when given, not to the others."""
    import warnings

    if not hasattr(admin, "list_groups"):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            everything = admin.list_groups(timeout=timeout_s)
    except Exception as exc:  # a broker that will not answer it: the consumer groups still stand
        log.debug("listing groups of other types failed: %s", _reason(exc))
        return None
    known = set(consumer_ids)
    # A group that matches the pattern but was not listed as a consumer group just before.
    unlisted = [g for g in everything if g.id not in known and pattern.fullmatch(g.id)]
    if missed is not None:
        missed.extend(sorted({g.id for g in unlisted if str(g.state or "Dead").lower() != "dead"
                              and (g.protocol_type or "") in ("", "consumer")}))
    others = sorted({g.id for g in unlisted} - set(missed or ()))
    with _NOTED_LOCK:
        new = [g for g in others if g not in _NOTED_OTHER]
        _NOTED_OTHER.update(new)
    for group_id in new:
        log.info("group %s is not a consumer group (a share or streams group): not diagnosed", group_id)
    return others


def list_group_ids(admin: Any, pattern: Any, timeout_s: float) -> list[str]:
    return list_groups(admin, pattern, timeout_s, other=False).ids


OFFSETS_TOPIC = "__consumer_offsets"
# Seconds to let a coordinator move finish before listing again.
RELIST_WAIT_S = 1.0


def coordinator_layout(metadata: Any) -> tuple[frozenset[int], tuple[tuple[int, int], ...]]:
    """The brokers and the leader of each __consumer_offsets partition (each group's
    coordinator); empty leaders when the principal cannot see that topic."""
    topic = metadata.topics.get(OFFSETS_TOPIC)
    partitions = (topic.partitions or {}) if topic is not None else {}
    return frozenset(metadata.brokers), tuple(sorted((p, m.leader) for p, m in partitions.items()))


def _layout_change(old: tuple, new: tuple) -> str:
    old_leaders, new_leaders = dict(old[1]), dict(new[1])
    moved = sorted(p for p in old_leaders.keys() | new_leaders.keys() if old_leaders.get(p) != new_leaders.get(p))
    parts = [f"brokers {sorted(old[0])} -> {sorted(new[0])}"] if old[0] != new[0] else []
    if moved:
        parts.append(f"{OFFSETS_TOPIC} partitions {moved} changed leader")
    return ", ".join(parts)


def list_groups_checked(admin: Any, pattern: Any, timeout_s: float, metadata: Any, *,
                        consumer_groups: Collection[str] = (), wait_s: float = RELIST_WAIT_S) -> GroupListing:
    """list_groups, marked partial when it may have missed groups without an error.

    A broker answers ListGroups only for the coordinator partitions it holds
    loaded, and leaves out those that just moved (Kafka maps NOT_COORDINATOR to
    an empty answer): a group whose coordinator moves during the fan-out is in
    no broker's answer, and no error says so. So the coordinators' layout
    (brokers, __consumer_offsets leaders) is read again after the listing (one
    Metadata request for that topic); if it changed, the groups are listed once
    more after `wait_s`, and if it changed again the listing says groups may be
    missing. A coordinator partition without a leader is in no answer either.

    `consumer_groups`: groups known to be consumer groups (listed before), never
    counted as share or streams groups when only ListGroups lists them now.
    """
    before = coordinator_layout(metadata)
    listing = list_groups(admin, pattern, timeout_s, other=False)
    ids, errors = listing.ids, list(listing.errors)
    partial: list[str] = []
    try:
        # Not asked when the topic is not visible: the request would create it.
        after = coordinator_layout(admin.list_topics(topic=OFFSETS_TOPIC, timeout=timeout_s)) if before[1] else None
    except Exception as exc:  # the listing stands; a cluster going away shows in every read that follows
        log.warning("group coordinators not read again after the listing: %s", _reason(exc))
        after = None
    if after is not None:
        if after != before:
            log.info("group coordinators moved while the groups were listed; listing again in %g s", wait_s)
            time.sleep(wait_s)
            try:
                again = list_groups(admin, pattern, timeout_s, other=False)
                settled = coordinator_layout(admin.list_topics(topic=OFFSETS_TOPIC, timeout=timeout_s))
            except Exception as exc:  # the first listing stands, marked partial
                partial.append("group listing: the group coordinators moved while the groups were listed "
                               f"and listing them again failed: {_reason(exc)}")
            else:
                # Listed either time means it existed; the second listing's errors are the ones that count.
                ids, errors = sorted(set(ids) | set(again.ids)), list(again.errors)
                if settled != after:
                    partial.append("group listing: the group coordinators moved while the groups were listed "
                                   f"({_layout_change(after, settled)})")
                after = settled
        leaderless = [p for p, leader in after[1] if leader < 0]
        if leaderless:
            partial.append(f"group listing: {OFFSETS_TOPIC} partitions {leaderless} have no leader "
                           "(their groups' coordinator is unavailable)")
    for error in partial:
        log.warning("%s: groups may be missing", error)
    errors += partial
    missed: list[str] = []
    other = other_group_ids(admin, set(ids) | set(consumer_groups), pattern, timeout_s, missed)
    if missed:
        log.info("%d consumer groups only ListGroups listed (their coordinator moved): read too", len(missed))
    return GroupListing(sorted(set(ids) | set(missed)), errors, other)


# The groups each admin client last listed, per pattern. A group that a later listing
# leaves out is read directly: only its own coordinator can say it is gone.
_LAST_LISTED: "weakref.WeakKeyDictionary[Any, dict[str, frozenset[str]]]" = weakref.WeakKeyDictionary()
_LAST_LISTED_LOCK = threading.Lock()


def _listed_before(admin: Any, pattern: Any) -> frozenset[str]:
    with _LAST_LISTED_LOCK:
        try:
            return _LAST_LISTED.get(admin, {}).get(pattern.pattern, frozenset())
        except TypeError:  # a client that cannot be weakly referenced: no memory
            return frozenset()


def _remember_listed(admin: Any, pattern: Any, ids: Iterable[str]) -> None:
    with _LAST_LISTED_LOCK:
        try:
            _LAST_LISTED.setdefault(admin, {})[pattern.pattern] = frozenset(ids)
        except TypeError:
            pass


def _is_gone(description: Description, commits: CommitRead) -> bool:
    """The group's coordinator says it does not exist: dead (or not found) with no commits."""
    not_found = description.error is not None and "GROUP_ID_NOT_FOUND" in description.error
    dead = description.error is None and description.state == "DEAD"
    return (dead or not_found) and commits.error is None and not commits.commits and not commits.partition_errors


def group_reader(admin: Any) -> Any:
    """The client for one snapshot's group reads: an IsolatedReader (a new
    AdminClient with `admin`'s config, in a child process) when `admin` is an
    AdminClient built here whose config can be sent to a child, else `admin` itself.

    librdkafka (2.16.0, and master as of 2026-07) kills the process reading
    groups in two ways during a broker restart:

    - SIGSEGV (librdkafka issue 5040): an AdminClient's ListConsumerGroupOffsets
      answered with a group-level NOT_COORDINATOR (the coordinator moved between
      FindCoordinator and OffsetFetch, as every rolling restart does) makes
      rd_kafka_handle_OffsetFetch ask the client's consumer group handle to
      re-query the coordinator; an AdminClient has none (NULL). No request
      pattern avoids it (bench/repro_offsetfetch_crash.py).
    - an assertion abort (rdkafka_queue.h: rd_kafka_enq_once_del_source_return:
      Assertion `eonce->refcnt > 0' failed, librdkafka issue 4605) when a
      coordinator request (DescribeGroups, OffsetFetch) times out on the client
      while its group's coordinator is down, and the client later finds a live
      coordinator for it: the lookup outlives the timed-out request (it has no
      timeout of its own) and then frees the request's state twice. Destroying
      the client once its group reads are answered ends those lookups before a
      coordinator can come back.

    So the reads run in a child process with a client of their own, which exits
    once they are answered: a crash costs that snapshot's group reads (read
    errors saying so, after one retry), not the sweep's process.
    """
    from confluent_kafka.admin import AdminClient

    config = config_of(admin)
    if config is None or not isinstance(admin, AdminClient):
        return admin
    isolated = IsolatedReader.of(config)
    return isolated if isolated is not None else AdminClient(config)


# Config entries every client built here carries (lagdoctor.kafka.clients), rebuilt in the
# child, and the parent's own observability hooks (its statistics count its own requests).
_PER_PROCESS_CONFIG = ("logger", "error_cb", "stats_cb", "statistics.interval.ms", "throttle_cb")
# Seconds a child may take beyond its read budget and one timeout: start, imports, answer.
_CHILD_SLACK_S = 30.0
_CHILD_MAIN = "from lagdoctor.kafka.collector import _read_groups_child; _read_groups_child()"


@dataclass(frozen=True)
class IsolatedReader:
    """A group reader's librdkafka config, pickled for a child process (see group_reader)."""

    config: bytes

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "IsolatedReader | None":
        import pickle

        sendable = {k: v for k, v in config.items() if k not in _PER_PROCESS_CONFIG}
        # pickle names a script's own objects by __main__, which the child cannot import
        local = [k for k, v in sendable.items() if callable(v) and getattr(v, "__module__", None) == "__main__"]
        if local:
            log.debug("group reads stay in this process: %s is defined in __main__", ", ".join(local))
            return None
        try:
            return cls(pickle.dumps(sendable))
        except Exception as exc:  # e.g. an oauth_cb closure: read in this process, as before
            log.debug("group reads stay in this process: the client config cannot be sent to a child (%s)", exc)
            return None

    def read(self, group_ids: list[str], timeout_s: float,
             window: RequestWindow) -> tuple[dict[str, Description], dict[str, CommitRead]]:
        import pickle
        import signal
        import subprocess
        import sys

        if not group_ids:
            return {}, {}
        reason = ""
        for attempt in (1, 2):
            budget = window.remaining()
            if budget <= 0:
                reason = reason or f"not read: the snapshot's {window.budget_s:g} s read budget ran out first"
                break
            request = pickle.dumps((self.config, group_ids, timeout_s, window.limit, budget))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            try:
                done = subprocess.run([sys.executable, "-c", _CHILD_MAIN], input=request, capture_output=True,
                                      env=env, timeout=budget + timeout_s + _CHILD_SLACK_S)
            except subprocess.TimeoutExpired:
                reason = f"not read: the group reads did not end within {budget + timeout_s:.0f} s"
                break
            said = done.stderr.decode("utf-8", "replace").splitlines()
            for line in said[:50]:  # the child's warnings: groups whose reads failed
                log.warning("%s", line)
            if done.returncode > 0:
                last = " ".join(said[-1].split()) if said else f"exit code {done.returncode}"
                reason = f"not read: the group reader failed: {last}"
                break
            if done.returncode == 0:
                kind, value = pickle.loads(done.stdout)
                if kind == "kafka":
                    from confluent_kafka import KafkaError, KafkaException

                    raise KafkaException(KafkaError(KafkaError._FAIL, value))
                return value
            try:
                name = signal.Signals(-done.returncode).name
            except ValueError:
                name = f"exit code {done.returncode}"
            reason = (f"not read: the Kafka client crashed ({name}) reading the consumer groups, "
                      f"a librdkafka bug a broker restart triggers")
            log.warning("the group reads' Kafka client crashed (%s, attempt %d of 2)", name, attempt)
        described = {g: Description("UNKNOWN", None, {}, f"group description: {reason}") for g in group_ids}
        commits = {g: CommitRead(error=f"committed offsets: {reason}") for g in group_ids}
        return described, commits


def _read_groups_child() -> None:
    """A child's group reads (IsolatedReader.read): the request pickled on stdin, the answer on stdout."""
    import pickle
    import sys

    from confluent_kafka import KafkaException

    from lagdoctor.kafka.clients import _admin_from_config, quiet_config

    out, sys.stdout = sys.stdout.buffer, sys.stderr  # nothing else may write the answer's stream
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config, group_ids, timeout_s, limit, budget_s = pickle.loads(sys.stdin.buffer.read())
    admin = _admin_from_config(*quiet_config(pickle.loads(config)))
    try:
        answer: tuple[str, Any] = ("ok", read_groups(admin, group_ids, timeout_s, RequestWindow(limit, budget_s)))
    except KafkaException as exc:
        answer = ("kafka", error_text(exc))
    out.write(pickle.dumps(answer))
    out.flush()
    # The answer is out: no destructor may run (and wait on, or crash in, librdkafka) now.
    os._exit(0)


def read_groups(
    admin: Any, group_ids: list[str], timeout_s: float, window: RequestWindow
) -> tuple[dict[str, Description], dict[str, CommitRead]]:
    """Every group's description and committed offsets, through `window`.

    DescribeConsumerGroups in calls of a few groups and OffsetFetch one group
    per call (confluent-kafka takes one group per request), interleaved so both
    kinds are in flight together."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    if isinstance(admin, IsolatedReader):
        return admin.read(group_ids, timeout_s, window)
    describing: dict[str, Future] = {}
    fetching: dict[str, Future] = {}
    # Several describe calls fit in the window at once, so they overlap too.
    chunk = max(1, window.limit // 4)
    for start in range(0, len(group_ids), chunk):
        batch = group_ids[start:start + chunk]
        describing.update(window.call(
            batch, lambda b=batch: admin.describe_consumer_groups(b, request_timeout=timeout_s), len(batch)))
        for group_id in batch:
            fetching.update(window.call(
                [group_id], lambda g=group_id: admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(g)], request_timeout=timeout_s)))
    described = {g: _description(g, describing.get(g)) for g in group_ids}
    commits = {g: _commit_read(g, fetching.get(g)) for g in group_ids}
    return described, commits


def _description(group_id: str, fut: Future | None) -> Description:
    try:
        if fut is None:
            raise RuntimeError("no answer for this group")
        desc = fut.result()
    except Exception as exc:  # e.g. missing DESCRIBE rights on one group
        reason = _reason(exc)
        log.warning("describing group %s failed: %s", group_id, reason)
        return Description("UNKNOWN", None, {}, f"group description: {reason}")
    state = group_state_name(getattr(desc, "state", None))
    members = list(desc.members or [])
    kind = group_type_name(getattr(desc, "type", None))
    if state == "UNKNOWN" and kind == "consumer" and members and all(hasattr(m, "target_assignment") for m in members):
        # confluent-kafka 2.16 has no name for KIP-848's Assigning and Reconciling (the
        # only consumer-group states it lacks) and says UNKNOWN. A member whose assignment
        # is not yet its target is reconciling; with none, the coordinator has not computed
        # the new target yet (assigning: seen live on Kafka 4.4 for 0.8-2 s after a member
        # joined or left), or for up to a heartbeat a member has not acknowledged a new
        # epoch that moved none of its partitions (Kafka says reconciling; epochs are not
        # in the client's answer).
        state = "RECONCILING" if _reconciling(members) else "ASSIGNING"
    owners: dict[tuple[str, int], Owner] = {}
    for m in members:
        for tp in getattr(m.assignment, "topic_partitions", None) or []:
            owners[(tp.topic, tp.partition)] = Owner(m.member_id, m.client_id, m.host,
                                                     getattr(m, "group_instance_id", None) or None)
    # An active state with no member list means membership unknown (Tansu,
    # or no DESCRIBE rights), which is not the same as zero members.
    count = len(members) if members or state in _NO_MEMBER_STATES else None
    return Description(state, count, owners, group_type=kind)


def group_type_name(kind: Any) -> str | None:
    """"consumer" (KIP-848) or "classic" for a confluent-kafka ConsumerGroupType; None
    when the client does not say (UNKNOWN, or a client without the field)."""
    name = (getattr(kind, "name", None) or (str(kind) if kind is not None else "")).lower()
    return name if name in ("consumer", "classic") else None


def _partitions_of(assignment: Any) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in getattr(assignment, "topic_partitions", None) or []}


def _reconciling(members: list[Any]) -> bool:
    """Some member of a KIP-848 group does not hold its target assignment yet."""
    return any(m.target_assignment is not None and _partitions_of(m.assignment) != _partitions_of(m.target_assignment)
               for m in members if hasattr(m, "target_assignment"))


def _commit_read(group_id: str, fut: Future | None) -> CommitRead:
    try:
        if fut is None:
            raise RuntimeError("no answer for this group")
        result = fut.result()
    except Exception as exc:  # coordinator loading or moving, a timeout: unknown, not "no commit"
        reason = _reason(exc)
        log.warning("reading committed offsets of %s failed: %s", group_id, reason)
        return CommitRead(error=f"committed offsets: {reason}")
    commits: dict[tuple[str, int], int | None] = {}
    errors: dict[tuple[str, int], str] = {}
    for tp in result.topic_partitions or []:
        key = (tp.topic, tp.partition)
        if tp.error is not None:
            errors[key] = f"committed offsets: {_reason(Exception(tp.error))}"
            continue
        # A negative offset (OFFSET_INVALID) means no commit for this partition.
        commits[key] = tp.offset if tp.offset is not None and tp.offset >= 0 else None
    return CommitRead(commits, errors)


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
                    reason = _reason(exc) + (" (and again after a retry)" if _leader_moved(exc) else "")
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


def read_budget(timeout_s: float) -> float:
    """Seconds after which a snapshot starts no more reads, by default: about eight
    times a snapshot of 10,000 groups on the embedded broker (7.6 s), six timeouts."""
    return max(60.0, 6 * timeout_s)


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
        before = _listed_before(admin, pattern) if exact is None else frozenset()
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
            topic_errors[name] = f"topic metadata: {_reason(Exception(topic.error))}"
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
        gone = {g for g in vanished if _is_gone(described[g], commits[g])}
        log.info("%d groups listed before were not listed now; read directly, %d still exist",
                 len(vanished), len(vanished - gone))
        ids = [g for g in ids if g not in gone]
    if exact is None:
        _remember_listed(admin, pattern, ids)
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
            reason = f"record not read: {_reason(exc)}"
            log.warning("records at committed offsets not read: %s", _reason(exc))
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
        return dict.fromkeys(topics, f"topic metadata: {_reason(exc)}")
    out = {}
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout_s + 1)
        except Exception as exc:
            first = exc.args[0] if exc.args else None
            if getattr(first, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            reason = _reason(exc)
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
        log.warning("topic retention unknown: %s", _reason(exc))
        return {}
    for resource, fut in futures.items():
        try:
            entries = fut.result(timeout=timeout_s + 1)
        except Exception as exc:
            log.warning("retention of topic %s unknown: %s", resource.name, _reason(exc))
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
