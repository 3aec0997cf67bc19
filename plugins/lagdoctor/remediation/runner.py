"""run_action: the one door every remediation goes through.

Order of checks for a call (a DAG task calls this; nothing else runs actions):

  1. idempotency   a final record for (run, incident, action, dry_run) is returned as is:
                   a retried task neither acts nor logs twice.
  2. guardrails    deny/allow lists, cooldown, hourly cap (guardrails.py),
                   also in dry runs so a dry run says what a real run would meet.
  3. prepare       what the action would do (pure).
  4. dry run       stop here: record ``dry_run``. A dry run never waits for a human.
  5. approval      irreversible actions (and those the config or runbook marks)
                   need ``approved=True``: ``None`` records ``awaiting_approval``
                   (the DAG then asks through a HITL ApprovalOperator and calls
                   again), ``False`` records ``rejected``.
  6. resolve       read live state, fix absolute targets, record ``started``.
  7. apply         ``executed`` / ``noop``; a failure is ``failed`` with a one-line,
                   secret-free reason and re-raised as RemediationFailed so the
                   task fails and Airflow may retry it (step 1 then reuses step 6).

Remediation never notifies: the returned record (a small JSON-able dict) is what
the DAG hands to ``lagdoctor.notify.post_action_result``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timezone
from typing import Any, Mapping

from lagdoctor.notify.redact import one_line, secret_values
from lagdoctor.remediation.actions import ActionBlocked, ActionContext, get_action
from lagdoctor.remediation.audit import FINAL_STATUSES, ActionLog
from lagdoctor.remediation.config import RemediationConfig
from lagdoctor.remediation.guardrails import check_guardrails

log = logging.getLogger(__name__)


class RemediationFailed(RuntimeError):
    """An action failed while changing something; the message is one safe line."""


def idempotency_key(run_id: str, finding: Mapping[str, Any], action: str) -> str:
    incident = [finding.get(k, "") for k in ("cluster", "group_id", "topic", "diagnosis")]
    raw = json.dumps([run_id, incident, action], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def needs_approval(name: str, *, dry_run: bool, config: RemediationConfig | None = None,
                   guardrails: Mapping[str, Any] | None = None) -> bool:
    """Whether a DAG must put an ApprovalOperator before this action. Never in a dry run."""
    if dry_run:
        return False
    action = get_action(name)
    if not action.changes_state:
        return False
    config = config or RemediationConfig.from_env()
    return bool(action.requires_approval or name in config.require_approval
                or (guardrails or {}).get("require_approval"))


def run_action(
    name: str,
    finding: Mapping[str, Any],
    *,
    run_id: str,
    dry_run: bool = True,
    approved: bool | None = None,
    params: Mapping[str, Any] | None = None,
    guardrails: Mapping[str, Any] | None = None,
    settings: Any = None,
    config: RemediationConfig | None = None,
    now: datetime | None = None,
    kafka_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or dry-run) one registered action for one finding; returns its audit record.

    ``params``/``guardrails`` come from the runbook's plan; ``kafka_config``
    overrides the cluster connection's extra (tests); ``now`` defaults to UTC now.
    """
    from lagdoctor.settings import Settings

    action = get_action(name)
    settings = settings or Settings.from_env()
    config = config or RemediationConfig.from_env()
    now = now or datetime.now(timezone.utc)
    params = dict(params or {})
    guardrails = dict(guardrails or {})
    audit = ActionLog(settings.actions_log)
    key = idempotency_key(run_id, finding, name)

    _kafka: dict[str, Any] = {}

    def resolve_kafka() -> dict[str, Any]:
        if not _kafka:
            if kafka_config is not None:
                _kafka.update(kafka_config)
            else:
                from lagdoctor.remediation.kafka_ops import kafka_config_for

                _kafka.update(kafka_config_for(str(finding.get("cluster"))))
        return _kafka

    ctx = ActionContext(finding=finding, config=config, params=params, now=now, kafka_config=resolve_kafka)
    approval = needs_approval(name, dry_run=False, config=config, guardrails=guardrails)
    base = {
        "run_id": run_id, "idempotency_key": key, "action": name,
        "cluster": ctx.cluster, "group_id": ctx.group_id, "topic": ctx.topic,
        "diagnosis": finding.get("diagnosis"), "dry_run": dry_run,
        "irreversible": action.irreversible, "requires_approval": approval and not dry_run,
        "warning": action.warning,
    }

    def record(status: str, message: str, plan: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        rec = {**base, "ts": now.isoformat(), "status": status, "message": message,
               "plan": dict(plan or {}), **extra}
        audit.append(rec)
        log.info("remediation %s %s for group %s: %s", name, status, ctx.group_id, message)
        return rec

    # 1. idempotency
    earlier = [r for r in audit.for_key(key) if r.get("dry_run") == dry_run]
    for r in reversed(earlier):
        if r.get("status") in FINAL_STATUSES:
            return r
    started = next((r for r in reversed(earlier) if r.get("status") == "started"), None)

    try:
        # 2. guardrails (advice changes nothing, so it is not rationed)
        if action.changes_state and started is None:
            effective = config
            if guardrails.get("cooldown_minutes") is not None:
                from dataclasses import replace

                # A runbook may only lengthen the cooldown, never shorten it.
                effective = replace(config, cooldown_minutes=max(config.cooldown_minutes,
                                                                  float(guardrails["cooldown_minutes"])))
            verdict = check_guardrails(
                cluster=ctx.cluster, group_id=ctx.group_id, action=name, config=effective,
                history=audit.executed_since(now - _max_window(effective)), now=now,
            )
            if not verdict.allowed:
                return record("blocked", f"{verdict.rule}: {verdict.reason}", rule=verdict.rule)

        # 3. prepare
        plan = started["plan"] if started else action.prepare(ctx)
        if not action.changes_state:
            outcome = action.apply(ctx, plan)
            return record(outcome.status, outcome.message, plan, detail=dict(outcome.detail))
        # 4. dry run
        if dry_run:
            return record("dry_run", "would " + action.describe(plan), plan)
        # 5. approval
        if approval and approved is None:
            return record("awaiting_approval", "needs approval: " + action.describe(plan), plan)
        if approval and approved is False:
            return record("rejected", "rejected by a human: " + action.describe(plan), plan)
        # 6. resolve
        if started is None:
            plan = action.resolve(ctx, dict(plan))
            record("started", action.describe(plan), plan)
        # 7. apply
        outcome = action.apply(ctx, plan)
        return record(outcome.status, outcome.message, plan, detail=dict(outcome.detail))
    except ActionBlocked as exc:
        return record("blocked", one_line(str(exc), secret_values(_kafka)), rule="action")
    except Exception as exc:
        message = one_line(_describe_error(exc), secret_values(_kafka))
        record("failed", message)
        raise RemediationFailed(f"{name} failed for group {ctx.group_id}: {message}") from None


def _max_window(config: RemediationConfig):
    from datetime import timedelta

    return max(timedelta(hours=1), timedelta(minutes=config.cooldown_minutes))


def _describe_error(exc: Exception) -> str:
    # kubernetes' ApiException prints headers and the whole body over many lines.
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason") and hasattr(exc, "body"):
        detail = ""
        try:
            detail = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"Kubernetes API {status} {exc.reason}" + (f": {detail}" if detail else "")
    return f"{type(exc).__name__}: {exc}"
