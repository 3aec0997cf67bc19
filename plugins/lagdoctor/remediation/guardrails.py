"""Guardrails: named pure rules deciding whether an action may change anything.

The rule table (each rule has a test case with its reason in
tests/test_remediation.py):

  1. deny_list    a group matching ``deny_groups`` is never touched.
  2. allow_list   when ``allow_groups`` is set, only matching groups are touched.
  3. cooldown     one real run of an action per target per ``cooldown_minutes``:
                  let the last change take effect before judging it. The target
                  is what the action changes (a Deployment, so two groups
                  sharing one share its cooldown; else the group).
  4. hourly_cap   at most ``max_actions_per_hour`` real changes across all
                  targets: a bad sweep must not restart the whole fleet.

The scale cap (never more consumers than partitions, ``max_replicas``)
depends on the action and lives in ``scale_consumers``. ``now`` is always a
parameter; history is what ``ActionLog.attempts_since`` counts: executed
changes and started ones whose outcome is unknown (a patch whose answer timed
out may have landed, so it counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any, Iterable

from lagdoctor.remediation.config import RemediationConfig


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule: str = ""
    reason: str = ""


ALLOW = Verdict(True)


def group_target(cluster: str, group_id: str, action: str) -> str:
    """The target of an action that changes the group itself (offsets, its topic)."""
    return f"group {group_id} on {cluster} ({action})"


def target_of(record: dict[str, Any]) -> str:
    return record.get("target") or group_target(
        str(record.get("cluster", "")), str(record.get("group_id", "")), str(record.get("action", "")))


def deny_list(group_id: str, config: RemediationConfig) -> Verdict:
    for pattern in config.deny_groups:
        if fnmatchcase(group_id, pattern):
            return Verdict(False, "deny_list", f"group matches deny pattern {pattern!r}")
    return ALLOW


def allow_list(group_id: str, config: RemediationConfig) -> Verdict:
    if config.allow_groups and not any(fnmatchcase(group_id, p) for p in config.allow_groups):
        return Verdict(False, "allow_list", "group is not on the allow list")
    return ALLOW


def _when(record: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(record["ts"])


def _what(record: dict[str, Any]) -> str:
    run = f" by run {record['run_id']}" if record.get("run_id") else ""
    if record.get("outcome") == "started":
        return f"started at {record['ts']}{run} and has no outcome yet"
    if record.get("outcome") == "failed":
        return f"started at {record['ts']}{run} and may have taken effect before it failed"
    return f"ran at {record['ts']}{run}"


def cooldown(
    target: str, action: str, config: RemediationConfig, history: Iterable[dict[str, Any]], now: datetime,
) -> Verdict:
    window = timedelta(minutes=config.cooldown_minutes)
    for r in sorted(history, key=_when, reverse=True):
        if (target_of(r), r.get("action")) != (target, action):
            continue
        if now - _when(r) < window:
            left = window - (now - _when(r))
            return Verdict(
                False, "cooldown",
                f"{action} on {target} {_what(r)}; cooldown ends in {int(left.total_seconds() // 60) + 1} min",
            )
    return ALLOW


def hourly_cap(config: RemediationConfig, history: Iterable[dict[str, Any]], now: datetime) -> Verdict:
    since = now - timedelta(hours=1)
    count = sum(1 for r in history if _when(r) > since)
    if count >= config.max_actions_per_hour:
        return Verdict(False, "hourly_cap", f"{count} actions in the last hour (cap {config.max_actions_per_hour})")
    return ALLOW


def check_guardrails(
    *, cluster: str, group_id: str, action: str, config: RemediationConfig,
    history: Iterable[dict[str, Any]], now: datetime, target: str | None = None,
) -> Verdict:
    """The first rule that says no, in table order; ALLOW otherwise."""
    history = list(history)
    target = target or group_target(cluster, group_id, action)
    for verdict in (
        deny_list(group_id, config),
        allow_list(group_id, config),
        cooldown(target, action, config, history, now),
        hourly_cap(config, history, now),
    ):
        if not verdict.allowed:
            return verdict
    return ALLOW
