"""Remediation: one registered action for every finding whose plan wants it, per approved target."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lagdoctor.settings import Settings
from lagdoctor.stages.common import read_plans
from lagdoctor.stages.notify import undelivered
from lagdoctor.stages.plan import approval_target_key

log = logging.getLogger(__name__)


class RemediationBlocked(RuntimeError):
    """A real (not dry) remediation that a guardrail or the action itself blocked: one line
    with the reasons. `changed`: whether the task changed anything for another group."""

    def __init__(self, message: str, *, changed: bool) -> None:
        super().__init__(message)
        self.changed = changed


def remediate(
    action: str,
    plans_path: str,
    run_id: str,
    *,
    dry_run: bool,
    approved: bool | None = None,
    settings: Settings | None = None,
    approval_by: Mapping[str, Any] | None = None,
    approved_keys: set[str] | None = None,
    not_offered: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Run one registered action for every finding that wants it; report each in its thread.

    `approved=None` where an action needs approval records it `awaiting_approval`
    and posts how to act: the sweep proposes, it never waits for a human.
    `approved_keys` (a per-target answer, see `approved_targets`): each target is
    approved only when its key is in it; the others are recorded `rejected`.
    `not_offered` (`not_offered_targets` of the form): a target the form showed blocked
    is recorded `blocked` with the form's reason and fails the run, whatever the answer.
    """
    from lagdoctor.notify.incidents import delivery_batch, post_action_result
    from lagdoctor.remediation import RemediationFailed, run_action

    statuses: dict[str, int] = {}
    failures: list[str] = []
    blocked: list[str] = []
    posted: list[Mapping[str, Any]] = []
    planned_items = [(item, planned) for item in read_plans(plans_path)
                     for planned in item["plan"]["actions"] if planned["action"] == action]
    with delivery_batch() as batch:
        for item, planned in planned_items:
            target_key = approval_target_key(item["finding"])
            if approved_keys is not None:
                approved = target_key in approved_keys
            try:
                record = run_action(
                    action, item["finding"], run_id=run_id, dry_run=dry_run, approved=approved,
                    params=planned.get("params") or {}, guardrails=planned.get("guardrails") or {},
                    settings=settings, approval_by=approval_by, not_offered=(not_offered or {}).get(target_key),
                )
            except RemediationFailed as exc:
                # One group's failure must not stop the action for the others;
                # the runner has audited it and the task fails at the end.
                failures.append(f"cluster {item['finding'].get('cluster')}: {exc}")  # exc names the group
                statuses["failed"] = statuses.get("failed", 0) + 1
                continue
            posted.append(post_action_result(record, settings=settings))
            statuses[record["status"]] = statuses.get(record["status"], 0) + 1
            if record["status"] == "blocked" and not dry_run:
                blocked.append(f"group {record.get('group_id')} on {record.get('cluster')}: {record.get('message')}")
    if batch.delivery is not None:
        posted.append(batch.delivery)
    log.info("%s: %s", action, statuses)
    if failures:
        raise RemediationFailed(f"{action} failed for {len(failures)} group(s); first: {failures[0]}")
    count, error = undelivered(posted)
    if count is None or count:
        # The action was taken and audited; its reply waits in the outbox for the next
        # run. Failing here would read as "the action failed" (post_findings shows Slack).
        log.warning("Slack: %s message(s) not delivered, kept in the outbox: %s", "some" if count is None else count, error)
    if blocked:
        # Recorded and posted above; raised last so the grid does not show a blocked change as done.
        changed = bool(statuses.get("executed") or statuses.get("noop"))
        line = (f"{action} blocked for {len(blocked)} of {len(planned_items)} group(s), not run: "
                + "; ".join(blocked[:3]) + (f"; and {len(blocked) - 3} more" if len(blocked) > 3 else ""))
        log.warning("%s", line)
        raise RemediationBlocked(" ".join(line.split())[:1000], changed=changed)
    return statuses
