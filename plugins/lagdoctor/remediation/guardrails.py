"""Guardrails: named pure rules deciding whether an action may change anything.

The rule table (each rule has a test case with its reason in
tests/test_remediation.py):

  1. deny_list    a group matching ``deny_groups`` is never touched.
  2. allow_list   when ``allow_groups`` is set, only matching groups are touched.
  3. cooldown     one real run of (cluster, group, action) per ``cooldown_minutes``:
                  let the last change take effect before judging it.
  4. hourly_cap   at most ``max_actions_per_hour`` real changes across all groups:
                  a bad sweep must not restart the whole fleet.

The scale cap (never more consumers than partitions) depends on the action and
lives in ``scale_consumers``. ``now`` is always a parameter; history is the
list of ``executed`` audit records.
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


def deny_list(group_id: str, config: RemediationConfig) -> Verdict:
    for pattern in config.deny_groups:
        if fnmatchcase(group_id, pattern):
            return Verdict(False, "deny_list", f"group matches deny pattern {pattern!r}")
    return ALLOW


def allow_list(group_id: str, config: RemediationConfig) -> Verdict:
    if config.allow_groups and not any(fnmatchcase(group_id, p) for p in config.allow_groups):
        return Verdict(False, "allow_list", "group is not on the allow list")
    return ALLOW


def cooldown(
    cluster: str, group_id: str, action: str, config: RemediationConfig,
    history: Iterable[dict[str, Any]], now: datetime,
) -> Verdict:
    window = timedelta(minutes=config.cooldown_minutes)
    for r in history:
        if (r.get("cluster"), r.get("group_id"), r.get("action")) != (cluster, group_id, action):
            continue
        ts = datetime.fromisoformat(r["ts"])
        if now - ts < window:
            left = window - (now - ts)
            return Verdict(
                False, "cooldown",
                f"{action} ran for this group at {r['ts']}; cooldown ends in {int(left.total_seconds() // 60) + 1} min",
            )
    return ALLOW


def hourly_cap(config: RemediationConfig, history: Iterable[dict[str, Any]], now: datetime) -> Verdict:
    since = now - timedelta(hours=1)
    count = sum(1 for r in history if datetime.fromisoformat(r["ts"]) > since)
    if count >= config.max_actions_per_hour:
        return Verdict(False, "hourly_cap", f"{count} actions in the last hour (cap {config.max_actions_per_hour})")
    return ALLOW


def check_guardrails(
    *, cluster: str, group_id: str, action: str, config: RemediationConfig,
    history: Iterable[dict[str, Any]], now: datetime,
) -> Verdict:
    """The first rule that says no, in table order; ALLOW otherwise."""
    history = list(history)
    for verdict in (
        deny_list(group_id, config),
        allow_list(group_id, config),
        cooldown(cluster, group_id, action, config, history, now),
        hourly_cap(config, history, now),
    ):
        if not verdict.allowed:
            return verdict
    return ALLOW
