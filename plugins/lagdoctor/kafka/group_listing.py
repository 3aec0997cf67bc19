"""Which consumer groups a cluster has: the group pattern, the listing
(ListConsumerGroups, checked against coordinator moves), the matching groups of
other types (share, streams), and what each admin client listed before."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from lagdoctor.kafka.clients import error_text, failure_reason

# A child of the collector's logger: a logging config naming lagdoctor.kafka.collector still covers these lines.
log = logging.getLogger("lagdoctor.kafka.collector.group_listing")

# Longer patterns are refused: a group pattern is a name filter, not a program.
MAX_GROUP_PATTERN_LENGTH = 1000


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
        errors.append(f"group listing: {failure_reason(Exception(kerr))}")
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
        log.debug("listing groups of other types failed: %s", failure_reason(exc))
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
        log.warning("group coordinators not read again after the listing: %s", failure_reason(exc))
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
                               f"and listing them again failed: {failure_reason(exc)}")
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


def listed_before(admin: Any, pattern: Any) -> frozenset[str]:
    with _LAST_LISTED_LOCK:
        try:
            return _LAST_LISTED.get(admin, {}).get(pattern.pattern, frozenset())
        except TypeError:  # a client that cannot be weakly referenced: no memory
            return frozenset()


def remember_listed(admin: Any, pattern: Any, ids: Iterable[str]) -> None:
    with _LAST_LISTED_LOCK:
        try:
            _LAST_LISTED.setdefault(admin, {})[pattern.pattern] = frozenset(ids)
        except TypeError:
            pass
