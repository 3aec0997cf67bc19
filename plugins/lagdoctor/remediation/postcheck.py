"""After lagdoctor acts: what the next sweeps see of it.

``post_check(record, finding, now)`` reads an ``executed`` record of the action log beside a
later finding of the same (cluster, group, topic), with its per-partition rows
(``evidence.partitions``, as the plan stage reads them). Pure: no clock, no I/O.
The rule table (one test case each in tests/test_postcheck.py):

 #  action             worked when                                 what "not yet" says
 1  add_partitions     every partition below the new count is      which new partitions are not yet assigned
                       owned by a live member                      (consumers see new partitions at their next
                                                                   metadata refresh: metadata.max.age.ms)
 2  restart_consumers  the group is STABLE with live members       its state and member count
 3  scale_consumers    the group has the target's members (or one   how many members it has of the target
                       per partition, whichever is fewer)
 4  skip_poison_pill   every skipped partition's commit is past     which partition still sits on the record
                       the record moved to the dead-letter topic
 5  pending            less than CHECK_AFTER_SECONDS since the      nothing is said in the thread yet; the finding
                       action: a group takes a rebalance or two     says the action is in flight (``attribution``)
 6  failed             still not worked GIVE_UP_SECONDS after it    said once, with what is still missing

A verdict is said once per action (the coordinator keys it by the record's idempotency key);
"not_yet" is never posted on its own: the sweep's findings carry ``attribution`` lines instead,
so a change lagdoctor made is never reported as a new, unexplained problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

CHECK_AFTER_SECONDS = 120.0
GIVE_UP_SECONDS = 600.0
# Actions whose effect the check can read from the next sweeps' findings.
CHECKED_ACTIONS = ("add_partitions", "restart_consumers", "scale_consumers", "skip_poison_pill")
# How long a finding names a recent action of lagdoctor's as part of its story.
ATTRIBUTION_SECONDS = 1800.0


@dataclass(frozen=True)
class Check:
    verdict: str  # pending | worked | not_yet | failed
    text: str


def _age(record: Mapping[str, Any], now: datetime) -> float | None:
    try:
        return (now - datetime.fromisoformat(str(record["ts"]))).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def _rows(finding: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), Mapping) else {}
    return {r["partition"]: r for r in evidence.get("partitions") or []
            if isinstance(r, Mapping) and isinstance(r.get("partition"), int)}


def _evidence(finding: Mapping[str, Any]) -> Mapping[str, Any]:
    value = finding.get("evidence")
    return value if isinstance(value, Mapping) else {}


def _ranges(parts: list[int]) -> str:
    out, start = [], None
    for i, p in enumerate(parts):
        if start is None:
            start = p
        if i + 1 == len(parts) or parts[i + 1] != p + 1:
            out.append(f"{start}" if start == p else f"{start}-{p}")
            start = None
    return ", ".join(out)


def _effect(record: Mapping[str, Any], finding: Mapping[str, Any]) -> tuple[bool, str] | None:
    """(worked, what the sweep sees) for one executed action; None when the finding cannot say."""
    action = record.get("action")
    plan = record.get("plan") if isinstance(record.get("plan"), Mapping) else {}
    detail = record.get("detail") if isinstance(record.get("detail"), Mapping) else {}
    ev, rows = _evidence(finding), _rows(finding)
    state, members = ev.get("group_state"), ev.get("group_members")
    if action == "add_partitions":
        before, after = plan.get("current"), detail.get("partitions") or plan.get("target")
        if not isinstance(before, int) or not isinstance(after, int) or not rows:
            return None
        new = list(range(before, after))
        unassigned = [p for p in new if not (rows.get(p) or {}).get("member_id")]
        if not unassigned:
            owners = {rows[p].get("member_id") for p in new}
            arriving = sum(float(rows[p].get("produce_rate") or 0) for p in new)
            return True, (f"partitions {_ranges(new)} are assigned ({len(owners)} member(s)) and receive "
                          f"{arriving:,.1f} msg/s")
        return False, (f"partitions {_ranges(unassigned)} not yet assigned (the group's consumers see new "
                       "partitions at their next metadata refresh, metadata.max.age.ms, default 5 min)")
    if action == "restart_consumers":
        if state is None:
            return None
        if state == "STABLE" and isinstance(members, int) and members > 0:
            return True, f"the group is STABLE again with {members} member(s)"
        count = "an unknown number of" if members is None else members
        return False, f"the group is {state} with {count} member(s)"
    if action == "scale_consumers":
        target = plan.get("target_replicas") or detail.get("replicas")
        if not isinstance(target, int) or not isinstance(members, int):
            return None
        partitions = ev.get("partition_count")
        wanted = min(target, partitions) if isinstance(partitions, int) else target
        if members >= wanted:
            return True, f"the group has {members} member(s), as scaled"
        return False, f"the group has {members} of {wanted} member(s)"
    if action == "skip_poison_pill":
        skipped = detail.get("skipped") if isinstance(detail.get("skipped"), Mapping) else {}
        if not skipped or not rows:
            return None
        stuck = [int(p) for p, offset in skipped.items()
                 if not isinstance((rows.get(int(p)) or {}).get("committed_offset"), int)
                 or rows[int(p)]["committed_offset"] <= int(offset)]
        if not stuck:
            where = ", ".join(f"partition {p} past offset {o} (now {rows[int(p)]['committed_offset']:,})"
                              for p, o in sorted(skipped.items(), key=lambda kv: int(kv[0])))
            return True, f"the group moved on: {where}"
        return False, "partition " + ", ".join(f"{p} still at offset {skipped[str(p)]}" for p in sorted(stuck))
    return None


def post_check(record: Mapping[str, Any], finding: Mapping[str, Any], now: datetime) -> Check | None:
    """Rules 1-6 for one executed action and a later finding of its (cluster, group, topic)."""
    if record.get("status") != "executed" or record.get("action") not in CHECKED_ACTIONS:
        return None
    age = _age(record, now)
    if age is None or age < 0:
        return None
    effect = _effect(record, finding)
    if effect is None:
        return None
    worked, seen = effect
    if worked:
        return Check("worked", seen)
    if age < CHECK_AFTER_SECONDS:
        return Check("pending", seen)
    return Check("failed" if age >= GIVE_UP_SECONDS else "not_yet", seen)


def _ago(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes} min ago" if minutes else f"{int(seconds)} s ago"


def attribution(record: Mapping[str, Any], finding: Mapping[str, Any], now: datetime) -> str | None:
    """One line a finding carries while a recent action of lagdoctor's explains part of it:
    "add_partitions by lagdoctor 3 min ago (grew orders from 2 to 8 partitions): partitions 2-7 not yet
    assigned ...". None once it worked, when it is older than ATTRIBUTION_SECONDS, or not checkable."""
    age = _age(record, now)
    if record.get("status") != "executed" or age is None or not 0 <= age <= ATTRIBUTION_SECONDS:
        return None
    check = post_check(record, finding, now)
    if check is None or check.verdict == "worked":
        return None
    return f"{record.get('action')} by lagdoctor {_ago(age)} ({record.get('message')}): {check.text}"
