"""Reading each group: DescribeConsumerGroups and its committed offsets
(OffsetFetch), in a child process that a librdkafka crash cannot take the
caller down with (see group_reader)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from lagdoctor.kafka.clients import config_of, error_text, failure_reason
from lagdoctor.kafka.request_window import RequestWindow

# A child of the collector's logger: a logging config naming lagdoctor.kafka.collector still covers these lines.
log = logging.getLogger("lagdoctor.kafka.collector.group_reads")

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


def is_gone(description: Description, commits: CommitRead) -> bool:
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
_CHILD_MAIN = "from lagdoctor.kafka.group_reads import _read_groups_child; _read_groups_child()"


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
        reason = failure_reason(exc)
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
        reason = failure_reason(exc)
        log.warning("reading committed offsets of %s failed: %s", group_id, reason)
        return CommitRead(error=f"committed offsets: {reason}")
    commits: dict[tuple[str, int], int | None] = {}
    errors: dict[tuple[str, int], str] = {}
    for tp in result.topic_partitions or []:
        key = (tp.topic, tp.partition)
        if tp.error is not None:
            errors[key] = f"committed offsets: {failure_reason(Exception(tp.error))}"
            continue
        # A negative offset (OFFSET_INVALID) means no commit for this partition.
        commits[key] = tp.offset if tp.offset is not None and tp.offset >= 0 else None
    return CommitRead(commits, errors)
